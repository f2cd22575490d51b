"""The numba.cuda kernels give the CPU kernels' bits under the CUDA simulator (in subprocesses: it must precede numba)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from tests import background
from tests.kernels.cuda_sim_checks import PARTS

GROUPS = (("float16", "bfloat16", "levels"), ("tree", "scale", "float32", "blocks", "grid"))
"""``cuda_sim_checks``' parts in two processes of about equal time, run side by side on two cores."""


@background.cold
def simulator_runs(folder: Path) -> tuple[list[list[str]], dict[str, str]]:
    """The two simulator processes (``GROUPS``), on lengths 1, 37, 1000 and 8200."""
    command = [sys.executable, "-m", "tests.kernels.cuda_sim_checks", "1", "37", "1000", "8200"]
    return ([command + [f"--part={part}" for part in group] for group in GROUPS],
            {**os.environ, "NUMBA_ENABLE_CUDASIM": "1"})


def test_the_groups_cover_every_part() -> None:
    assert sorted(part for group in GROUPS for part in group) == sorted(PARTS)


@background.job(simulator_runs)
def test_cuda_kernels_match_cpu_kernels_under_the_simulator() -> None:
    for group, done in zip(GROUPS, background.results(simulator_runs, timeout=900).outcomes):
        assert done.returncode == 0, f"parts {group}:\n{done.output}{done.errors}"
        assert "cuda kernels == cpu kernels" in done.output, done.output
