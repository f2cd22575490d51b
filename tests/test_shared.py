"""world_once: one computation per in-process world, each rank's value from exactly its own arguments."""

from __future__ import annotations

import threading

import numpy as np
import pytest

import compcoll
from compcoll.launcher import run_threads
from tests.shared import world_once

_CALLS: list[int] = []
_LOCK = threading.Lock()


def _simulate(values: list[np.ndarray], offset: float) -> list[np.ndarray]:
    with _LOCK:
        _CALLS.append(len(values))
    return [v + offset for v in values]


def _fails(rank: int) -> None:
    raise ValueError(f"failed for rank {rank}")


def shares(comm: compcoll.Communicator) -> None:
    """Same arguments: one computation for the world; different arguments (one rank's): each its own."""
    values = [np.arange(5, dtype=np.float32) * q for q in range(comm.size)]
    out = world_once(comm, _simulate, values, 0.5)
    assert np.array_equal(out[comm.rank], values[comm.rank] + 0.5)
    mine = world_once(comm, _simulate, values, float(comm.rank == 0))
    assert np.array_equal(mine[1], values[1] + float(comm.rank == 0)), "a rank read a value of other arguments"
    with pytest.raises(ValueError, match="failed for rank 0"):
        world_once(comm, _fails, 0)


def test_one_computation_per_world_and_none_across_arguments() -> None:
    _CALLS.clear()
    run_threads("tests.test_shared:shares", 4, timeout=60)
    assert _CALLS == [4, 4, 4], _CALLS  # the shared call once; the second call's two argument sets


def test_threads_of_torchs_threaded_group_share_once_they_join_a_world() -> None:
    """DDP's thread ranks (``tests/ddp/threaded_group.py``) are a ``ThreadWorld``: one computation for the world."""
    from tests.ddp.threaded_group import run_threaded_group

    _CALLS.clear()
    run_threaded_group(shares, 3)
    assert _CALLS == [3, 3, 3], _CALLS


def test_other_communicators_compute_for_themselves() -> None:
    _CALLS.clear()
    world_once(compcoll.SingleComm(), _simulate, [np.ones(3)], 1.0)
    world_once(compcoll.SingleComm(), _simulate, [np.ones(3)], 1.0)
    assert _CALLS == [1, 1]
