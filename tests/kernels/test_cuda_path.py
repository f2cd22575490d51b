"""The CUDA path of the codecs, collectives and optimizers on CPU tensors (``kernels.launch.simulate``).

Its kernels run under numba's simulator, in subprocesses: the simulator must precede numba.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from compcoll import codecs
from compcoll.kernels.launch import SIMULATE_ENV, simulate, simulating
from tests import background
from tests.kernels.cuda_path_checks import PARTS

GROUPS = (("flat", "codecs", "replay", "optimizers"), ("blocks", "counts", "ddp", "hierarchical"))
"""``cuda_path_checks``' parts in two processes of about equal time, run side by side on two cores."""


def path_runs(folder: Path) -> tuple[list[list[str]], dict[str, str]]:
    """The two processes (``GROUPS``), CPU tensors on the CUDA path."""
    command = [sys.executable, "-m", "tests.kernels.cuda_path_checks"]
    return ([command + [f"--part={part}" for part in group] for group in GROUPS],
            {"NUMBA_ENABLE_CUDASIM": "1", SIMULATE_ENV: "1"})


def test_the_groups_cover_every_part() -> None:
    assert sorted(part for group in GROUPS for part in group) == sorted(PARTS)


def test_cpu_tensors_take_the_cuda_path_only_under_the_simulator() -> None:
    assert not simulating() and codecs.on_host(torch.zeros(1))
    with pytest.raises(ValueError, match="only under numba's CUDA simulator: set NUMBA_ENABLE_CUDASIM=1"):
        simulate(True)
    assert not simulating()


WAIT_S = 1500
"""Seconds the test waits for the two processes (a hang's bound): in the suite on the 2-core VM they ran niced
beside the other tests, and the test waited 770 s for them at 1a65396 (664 s a stop before), close to the 900 it
had."""


@background.job(path_runs)
def test_the_cuda_path_on_cpu_tensors_matches_the_reference_and_the_cpu_path() -> None:
    for group, done in zip(GROUPS, background.results(path_runs, timeout=WAIT_S).outcomes):
        assert done.returncode == 0, f"parts {group}:\n{done.output}{done.errors}"
        assert "the CUDA path == the reference and the CPU path" in done.output, done.output
