"""python -m compcoll.warmup compiles the kernels into the cache: a fresh process's first call is then fast."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests import background

_FIRST_CALL = """
import torch, compcoll
from compcoll.kernels import cpu
compcoll.compressed_allreduce(torch.ones(100), torch.zeros(104), torch.zeros(104), compcoll.SingleComm())
kernels = (cpu.SERIAL["compensate_encode"], cpu.SERIAL["compensated_power_sum"])
print(sum(sum(d.stats.cache_hits.values()) for d in kernels), sum(sum(d.stats.cache_misses.values()) for d in kernels))
"""


@background.cold
def warmup_into_an_empty_cache(folder: Path) -> tuple[list[list[str]], dict[str, str]]:
    """``python -m compcoll.warmup`` with ``NUMBA_CACHE_DIR`` the job's empty folder."""
    return [[sys.executable, "-m", "compcoll.warmup"]], {**os.environ, "NUMBA_CACHE_DIR": str(folder)}


@background.job(warmup_into_an_empty_cache)
def test_warmup_fills_the_cache_for_a_fresh_process() -> None:
    finished = background.results(warmup_into_an_empty_cache, timeout=600)
    [done], env = finished.outcomes, finished.env
    assert done.returncode == 0 and "compiled and cached" in done.output, done.output + done.errors
    hits, misses = subprocess.run([sys.executable, "-c", _FIRST_CALL], env=env, capture_output=True, text=True,
                                  timeout=300, check=True).stdout.split()
    assert int(hits) == 2 and int(misses) == 0, (hits, misses)
