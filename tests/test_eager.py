"""compcoll.eager: training steps compiled with torch.compile around compcoll's optimizers (Gloo ranks)."""

from __future__ import annotations

import pytest

from tests.pool import run

WORKERS = "tests.eager_workers"


@pytest.mark.parametrize("name", ["OneBitAdam", "OneBitLamb", "ZeroOneAdam", "Birder"])
def test_a_compiled_training_step_equals_the_eager_one(name: str) -> None:
    run(f"{WORKERS}:compiled_step_equals_eager", 2, "gloo", args=(name,))
