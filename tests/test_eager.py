"""compcoll.eager: torch.compile around compcoll's optimizers (Gloo ranks) and collectives (MPI ranks)."""

from __future__ import annotations

import pytest

from tests.pool import run

WORKERS = "tests.eager_workers"


@pytest.mark.parametrize("name", ["OneBitAdam", "OneBitLamb", "ZeroOneAdam", "Birder"])
def test_a_compiled_training_step_equals_the_eager_one(name: str) -> None:
    run(f"{WORKERS}:compiled_step_equals_eager", 2, "gloo", args=(name,))


@pytest.mark.parametrize("backend, world_size", [("mpi", 1), ("gloo", 2)])
def test_the_collectives_inside_a_compiled_function_equal_the_eager_calls(backend: str, world_size: int) -> None:
    """On 1 rank, Dynamo tracing into the call failed; on 2 its trace happened to run."""
    run(f"{WORKERS}:compiled_calls_equal_eager", world_size, backend)
