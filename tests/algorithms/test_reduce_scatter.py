"""compressed_reduce_scatter against the numpy reference, on in-process ranks and on real MPI and Gloo ranks."""

from __future__ import annotations

import pytest

from tests.pool import run
from tests.worlds import worlds

WORKERS = "tests.algorithms.reduce_scatter_workers"
ROWS = [1, 37, 1000, 4099]


@pytest.mark.parametrize("backend, world_size", worlds((1, 2, 3, 4, 5), mpi=3, gloo=4))
def test_matches_reference_over_steps(backend: str, world_size: int) -> None:
    """Every dtype, op, scale and bits per element on threads; the real transports on the shorter rows."""
    run(f"{WORKERS}:numerics", world_size, backend, args=(ROWS if backend == "threads" else ROWS[:3], 3))


@pytest.mark.parametrize("backend, world_size", worlds((1, 2, 3), mpi=2, gloo=3))
def test_bad_inputs_raise_on_every_rank(backend: str, world_size: int) -> None:
    run(f"{WORKERS}:bad_inputs", world_size, backend)
