"""The process groups and communicators compcoll makes end with their users (real Gloo and MPI ranks).

A group ends with the communicators that use it.
"""

from __future__ import annotations

from tests.pool import run


def test_made_groups_end_with_their_communicators() -> None:
    run("tests.comm.comm_workers:made_groups_end_with_their_communicators", 3, "gloo", timeout=90)


def test_split_mpi_communicators_end_with_theirs() -> None:
    run("tests.comm.comm_workers:split_communicators_end_with_theirs", 3, "mpi", timeout=90)
