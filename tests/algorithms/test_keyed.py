"""CompressedAllreduce: its state taken and loaded in the communicator's order, behind the calls in flight.

On in-process, MPI and Gloo ranks (its resume and in-place use: tests/algorithms/test_onebit.py).
"""

from __future__ import annotations

import pytest

from tests.pool import run
from tests.worlds import worlds

WORKERS = "tests.algorithms.onebit_workers"


@pytest.mark.parametrize("backend, world_size", worlds((1, 2, 3), mpi=2, gloo=2))
def test_a_state_dict_waits_for_the_calls_in_flight(backend: str, world_size: int) -> None:
    run(f"{WORKERS}:state_behind_calls", world_size, backend)
