"""The OR of boolean masks across 1-4 ranks, sent as packed bits or as indices of the new coordinates."""

from __future__ import annotations

import pytest

from tests.pool import run
from tests.worlds import worlds


@pytest.mark.parametrize("backend, world_size", worlds((1, 2, 3, 4, 7), mpi=3, gloo=None))
def test_union_of_masks(backend: str, world_size: int) -> None:
    for numel, density in ((1, 0.5), (37, 0.3), (10007, 0.001), (10007, 0.2)):
        run("tests.optim.live_workers:union", world_size, backend, args=(numel, density))
