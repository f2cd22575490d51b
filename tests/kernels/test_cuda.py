"""The numba.cuda kernels give the CPU kernels' bits under the CUDA simulator (a subprocess: the switch must precede numba)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_cuda_kernels_match_cpu_kernels_under_the_simulator() -> None:
    env = {**os.environ, "NUMBA_ENABLE_CUDASIM": "1"}
    done = subprocess.run([sys.executable, "-m", "tests.kernels.cuda_sim_checks", "1", "37", "1000", "8200"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "cuda kernels == cpu kernels" in done.stdout
