"""Parameters a framework moves, assigns, loads or casts after the optimizer exists keep training.

On 1-3 ranks; frozen ones are left alone.
"""

from __future__ import annotations

import pytest

from tests import background
from tests.pool import run
from tests.thread_jobs import Batch

from .follow_workers import CHANGES

WORKERS = "tests.optim.follow_workers"
FOLLOW_ARGS = ("cpu", "cpu:0", list(CHANGES))
FOLLOW_JOB = Batch(*((f"{WORKERS}:built_then_changed", n, FOLLOW_ARGS) for n in (1, 2, 3)))


@pytest.mark.parametrize("world_size, backend, changes",
                         [pytest.param(n, backend, list(CHANGES), id=f"{n}-{backend}")
                          for n, backend in [(1, "threads"), (2, "threads"), (3, "threads"), (2, "mpi")]]
                         + [pytest.param(2, "gloo", ["to"], id="2-gloo-to")])
@background.job(FOLLOW_JOB.make)
def test_built_then_changed_equals_changed_then_built(world_size: int, backend: str, changes: list[str]) -> None:
    """Every change on thread ranks (in a background job: ``tests/thread_jobs.py``) and on MPI; on Gloo (a call
    there costs 8 of MPI's here) the move alone, before and in the middle of training."""
    FOLLOW_JOB.run(f"{WORKERS}:built_then_changed", world_size, backend, args=("cpu", "cpu:0", changes))


@pytest.mark.parametrize("change, world_size, backend", [("shape", 2, "threads"), ("groups", 2, "threads"),
                                                         ("freeze", 2, "threads"), ("unfreeze", 3, "threads"),
                                                         ("groups", 3, "mpi"), ("shape", 3, "gloo")])
def test_changes_that_cannot_be_followed_raise_on_every_rank(change: str, world_size: int, backend: str) -> None:
    run(f"{WORKERS}:unfollowable_changes_raise_everywhere", world_size, backend, args=(change,))


@pytest.mark.parametrize("world_size, backend", [(1, "threads"), (3, "threads"), (2, "mpi"), (2, "gloo")])
def test_frozen_parameters_are_left_alone_as_if_left_out(world_size: int, backend: str) -> None:
    run(f"{WORKERS}:frozen_equals_left_out", world_size, backend)


@pytest.mark.parametrize("world_size, backend", [(2, "threads"), (2, "mpi")])
def test_zero_one_adam_takes_weights_loaded_in_its_local_phase(world_size: int, backend: str) -> None:
    run(f"{WORKERS}:zero_one_adam_takes_weights_loaded_in_its_local_phase", world_size, backend)
