"""Where a test body runs: in-process thread ranks at every world size, and one real MPI and one real Gloo world."""

from __future__ import annotations

from typing import Sequence


def worlds(sizes: Sequence[int] = (1, 2, 3, 4), mpi: int | None = 3, gloo: int | None = 2) -> list[tuple[str, int]]:
    """(backend, world_size) cases: ``sizes`` on "threads" (``compcoll.comm.local_world``, the bits of MPI and Gloo
    ranks: tests/comm/test_local.py), then ``mpi`` ranks of real MPI and ``gloo`` of real Gloo (None: none)."""
    return ([("threads", n) for n in sizes] + ([("mpi", mpi)] if mpi else []) + ([("gloo", gloo)] if gloo else []))
