"""python -m compcoll.warmup compiles the kernels into the cache: a fresh process's first call is then fast."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

_FIRST_CALL = """
import torch, compcoll
from compcoll.kernels import cpu
compcoll.compressed_allreduce(torch.ones(100), torch.zeros(104), torch.zeros(104), compcoll.SingleComm())
kernels = (cpu.SERIAL["compensate_encode"], cpu.SERIAL["compensated_power_sum"])
print(sum(sum(d.stats.cache_hits.values()) for d in kernels), sum(sum(d.stats.cache_misses.values()) for d in kernels))
"""


def test_warmup_fills_the_cache_for_a_fresh_process(tmp_path: Path) -> None:
    env = {**os.environ, "NUMBA_CACHE_DIR": str(tmp_path)}
    done = subprocess.run([sys.executable, "-m", "compcoll.warmup"], env=env, capture_output=True, text=True,
                          timeout=600, check=True)
    assert "compiled and cached" in done.stdout
    hits, misses = subprocess.run([sys.executable, "-c", _FIRST_CALL], env=env, capture_output=True, text=True,
                                  timeout=300, check=True).stdout.split()
    assert int(hits) == 2 and int(misses) == 0, (hits, misses)
