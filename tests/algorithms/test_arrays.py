"""numpy arrays (through DLPack, no copy) in every allreduce, on 1-3 in-process ranks and on real MPI and Gloo ranks."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from compcoll.algorithms.arrays import to_library
from tests.pool import run
from tests.worlds import worlds

WORKERS = "tests.algorithms.arrays_workers"


@pytest.mark.parametrize("backend, world_size", worlds((1, 2, 3), mpi=2, gloo=3))
def test_numpy_arrays_match_the_reference(backend: str, world_size: int) -> None:
    run(f"{WORKERS}:numpy_arrays", world_size, backend, args=(3,))


@pytest.mark.parametrize("backend, world_size", worlds((1, 3), gloo=2))
def test_keyed_allreduce_and_reduce_scatter_take_numpy_arrays(backend: str, world_size: int) -> None:
    run(f"{WORKERS}:keyed_and_scattered", world_size, backend, args=(4,))


def test_results_view_the_tensor_they_come_from() -> None:
    tensor = torch.arange(5, dtype=torch.float32)
    array = to_library(tensor, np)
    array[0] = 7.0
    assert isinstance(array, np.ndarray) and tensor[0].item() == 7.0
