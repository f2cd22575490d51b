"""exact_average against the numpy reference, on 1-8 in-process ranks and on real MPI and Gloo ranks."""

from __future__ import annotations

import pytest

from tests.pool import run
from tests.worlds import worlds

WORKERS = "tests.algorithms.exact_workers"
LENGTHS = [1, 37, 1920, 12289]
"""Lengths averaged; 1920 is a multiple of every world size here (rows sent and gathered as they are)."""


@pytest.mark.parametrize("backend, world_size", worlds((1, 2, 3, 4, 5, 8), mpi=3, gloo=2))
def test_matches_reference_in_place_or_not(backend: str, world_size: int) -> None:
    run(f"{WORKERS}:numerics", world_size, backend, args=(LENGTHS, 2))
