"""compcoll.checkpoint: per-rank files resume exactly; frameworks' rank-0 optimizer state loads on every rank."""

from __future__ import annotations

import pytest

from tests.pool import run

WORKERS = "tests.checkpoint_workers"
COMPRESSED_AT = {"OneBitAdam": 9, "OneBitLamb": 9, "ZeroOneAdam": 11, "Birder": 9}
"""A step in each optimizer's compressed phase (0/1 Adam: between syncs), where the error buffers are not zero."""


@pytest.mark.parametrize("name", list(COMPRESSED_AT))
def test_per_rank_files_resume_exactly(name: str, tmp_path) -> None:
    run(f"{WORKERS}:per_rank_files_resume_exactly", 3, "mpi", args=(name, COMPRESSED_AT[name], str(tmp_path)))


def test_per_rank_files_resume_exactly_over_gloo(tmp_path) -> None:
    run(f"{WORKERS}:per_rank_files_resume_exactly", 2, "gloo", args=("OneBitLamb", 9, str(tmp_path)))


@pytest.mark.parametrize("name, at", [("OneBitAdam", 2), ("OneBitAdam", 9), ("OneBitLamb", 9), ("ZeroOneAdam", 11),
                                      ("Birder", 9)])
def test_rank_zero_state_loads_on_every_rank(name: str, at: int, tmp_path) -> None:
    run(f"{WORKERS}:rank_zero_state_on_every_rank", 2, "gloo", args=(name, at, str(tmp_path)))


@pytest.mark.parametrize("backend", ["mpi", "gloo"])
def test_a_missing_file_fails_every_rank(backend: str, tmp_path) -> None:
    run(f"{WORKERS}:a_missing_file_fails_every_rank", 2, backend, args=(str(tmp_path),))
