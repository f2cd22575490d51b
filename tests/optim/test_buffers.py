"""broadcast_buffers: every rank's module buffers become rank root's, bit for bit; mismatches fail on every rank."""

from __future__ import annotations

import pytest

from tests.pool import run

WORKERS = "tests.optim.buffers_workers"


@pytest.mark.parametrize("world_size, backend, root", [(1, "threads", 0), (3, "threads", 0), (3, "threads", 2),
                                                       (2, "mpi", 1), (2, "gloo", 0)])
def test_every_rank_takes_the_roots_buffers(world_size: int, backend: str, root: int) -> None:
    run(f"{WORKERS}:buffers_become_roots", world_size, backend, args=(root,))


@pytest.mark.parametrize("world_size, backend", [(2, "threads"), (3, "mpi")])
def test_mismatched_buffers_and_a_bad_root_fail_on_every_rank(world_size: int, backend: str) -> None:
    run(f"{WORKERS}:mismatched_buffers_fail_everywhere", world_size, backend)
