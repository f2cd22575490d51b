"""The numba.cuda kernels give the CPU kernels' bits under the CUDA simulator (in subprocesses: it must precede numba)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.kernels.cuda_sim_checks import PARTS

ROOT = Path(__file__).resolve().parents[2]
GROUPS = (("float16", "bfloat16"), ("tree", "scale", "float32", "blocks", "grid"))
"""``cuda_sim_checks``' parts in two processes of about equal time, run side by side on two cores."""


def test_the_groups_cover_every_part() -> None:
    assert sorted(part for group in GROUPS for part in group) == sorted(PARTS)


def test_cuda_kernels_match_cpu_kernels_under_the_simulator() -> None:
    env = {**os.environ, "NUMBA_ENABLE_CUDASIM": "1"}
    command = [sys.executable, "-m", "tests.kernels.cuda_sim_checks", "1", "37", "1000", "8200"]
    processes = [subprocess.Popen(command + [f"--part={part}" for part in group], cwd=ROOT, env=env, text=True,
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT) for group in GROUPS]
    try:
        for group, process in zip(GROUPS, processes):
            output, _ = process.communicate(timeout=600)
            assert process.returncode == 0, f"parts {group}:\n{output}"
            assert "cuda kernels == cpu kernels" in output, output
    finally:
        for process in processes:
            process.kill()
            process.wait()
