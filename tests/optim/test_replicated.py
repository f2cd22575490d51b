"""compcoll.optim.replicated: a warning when every rank hands the optimizer the same gradient."""

from __future__ import annotations

import pytest
import torch

from compcoll.optim.replicated import ALL_ZERO, fingerprint, same_everywhere
from tests.pool import run

WORKERS = "tests.optim.replicated_workers"


def test_fingerprints_tell_gradients_apart_and_all_zero_samples_tell_nothing() -> None:
    gen = torch.Generator().manual_seed(0)
    grads = [torch.randn(1001, generator=gen) for _ in range(2)]
    assert fingerprint(grads[0]) == fingerprint(grads[0].clone()) != fingerprint(grads[1])
    assert fingerprint(torch.zeros(1001)) == ALL_ZERO and fingerprint(torch.randn(3, generator=gen)) != ALL_ZERO
    assert same_everywhere([5.0, 5.0]) and not same_everywhere([5.0, 6.0])
    assert not same_everywhere([5.0]) and not same_everywhere([ALL_ZERO, ALL_ZERO])


@pytest.mark.parametrize("name", ["OneBitAdam", "ZeroOneAdam"])
def test_gradients_the_same_on_every_rank_warn(name: str) -> None:
    run(f"{WORKERS}:same_gradients_warn", 2, "gloo", args=(name,))
