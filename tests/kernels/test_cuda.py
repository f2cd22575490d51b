"""The numba.cuda kernels give the CPU kernels' bits under the CUDA simulator (in subprocesses: it must precede numba)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tests import background
from tests.kernels.cuda_sim_checks import PARTS

GROUPS = (("tree", "float16", "bfloat16", "levels", "races", "scale"),
          ("float32", "blocks", "grid"))
"""``cuda_sim_checks``' parts in two processes of about equal time, run side by side on two cores."""


@background.cold
def simulator_runs(folder: Path) -> tuple[list[list[str]], dict[str, str]]:
    """The two simulator processes (``GROUPS``), on lengths 1, 37, 1000 and 8200."""
    command = [sys.executable, "-m", "tests.kernels.cuda_sim_checks", "1", "37", "1000", "8200"]
    return ([command + [f"--part={part}" for part in group] for group in GROUPS],
            {"NUMBA_ENABLE_CUDASIM": "1"})


def test_the_groups_cover_every_part() -> None:
    assert sorted(part for group in GROUPS for part in group) == sorted(PARTS)


@background.job(simulator_runs)
def test_cuda_kernels_match_cpu_kernels_under_the_simulator() -> None:
    for group, done in zip(GROUPS, background.results(simulator_runs, timeout=900).outcomes):
        assert done.returncode == 0, f"parts {group}:\n{done.output}{done.errors}"
        assert "cuda kernels == cpu kernels" in done.output, done.output


def test_a_block_size_is_a_shift_and_only_a_power_of_two_is_taken() -> None:
    """The kernels shift by log2 of the block size where they would divide by it: a size that is not a power of two
    (``spec`` refuses one first) would shift to other blocks, so it is refused here too."""
    from compcoll.kernels.cuda import _shift

    assert [_shift(b) for b in (1, 8, 64, 8192)] == [0, 3, 6, 13]
    with pytest.raises(ValueError, match="block size 48 is not a power of two"):
        _shift(48)
