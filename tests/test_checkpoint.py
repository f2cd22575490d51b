"""compcoll.checkpoint: per-rank files resume exactly; frameworks' rank-0 optimizer state loads on every rank."""

from __future__ import annotations

import pytest

from compcoll.checkpoint import path_of, saved_file
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


@pytest.mark.parametrize("backend, damage", [("mpi", "missing"), ("gloo", "missing"), ("threads", "garbage")])
def test_a_missing_or_damaged_file_fails_every_rank(backend: str, damage: str, tmp_path) -> None:
    run(f"{WORKERS}:a_missing_file_fails_every_rank", 2, backend, args=(str(tmp_path), damage))


@pytest.mark.parametrize("name", list(COMPRESSED_AT))
def test_another_world_size_resumes_from_every_rank_file(name: str, tmp_path) -> None:
    """An elastic restart: files saved by 3 ranks load on 2 and on 4 (ranks 0-2 and, on 4, rank 3 from rank 0's)."""
    run(f"{WORKERS}:save_every_rank", 3, "gloo", args=(name, COMPRESSED_AT[name], str(tmp_path)))
    for size in (2, 4):
        run(f"{WORKERS}:resume_on_another_world_size", size, "gloo",
            args=(name, COMPRESSED_AT[name], str(tmp_path), 3))


def test_the_file_each_rank_loads(tmp_path) -> None:
    """``saved_file``: this rank's own where it is there; otherwise rank ``rank % m``'s of the one complete world of
    another size m; otherwise FileNotFoundError naming what was found (two other worlds, an incomplete one, or
    this world's files with this rank's missing)."""
    def files(*names: str) -> None:
        for name in names:
            (tmp_path / name).touch()

    files(*(f"compcoll-rank{r}-of-3.pt" for r in range(3)))
    assert saved_file(tmp_path, 1, 3) == path_of(tmp_path, 1, 3)
    assert saved_file(tmp_path, 4, 5) == path_of(tmp_path, 1, 3)
    assert saved_file(tmp_path, 0, 2) == path_of(tmp_path, 0, 3)
    files("compcoll-rank0-of-2.pt")
    with pytest.raises(FileNotFoundError, match="compcoll-rank1-of-2.pt in .*found: compcoll-rank0-of-2.pt, "):
        saved_file(tmp_path, 1, 2)
    with pytest.raises(FileNotFoundError, match="every file of one other world size"):
        saved_file(tmp_path, 0, 4)
    (tmp_path / "compcoll-rank0-of-2.pt").unlink()
    (tmp_path / "compcoll-rank2-of-3.pt").unlink()
    with pytest.raises(FileNotFoundError, match="compcoll-rank0-of-4.pt"):
        saved_file(tmp_path, 0, 4)
