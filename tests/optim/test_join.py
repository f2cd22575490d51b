"""compcoll.optim.join: uneven inputs under torch's Join, and a clear error where Join cannot apply."""

from __future__ import annotations

import pytest
import torch
from torch.distributed.algorithms.join import Join

import compcoll
from compcoll.optim import OneBitAdam
from tests.optim.optim_workers import CONFIGS
from tests.pool import run

WORKERS = "tests.optim.join_workers"


@pytest.mark.parametrize("name", [name for name in CONFIGS if name != "OneBitLamb layers"])
def test_ranks_that_run_out_of_batches_step_on_zeros_under_join(name: str) -> None:
    run(f"{WORKERS}:uneven_inputs_join", 2, "gloo", args=(name,))


def test_two_optimizers_in_the_order_they_step_share_one_join() -> None:
    run(f"{WORKERS}:two_optimizers_join", 2, "gloo")


def test_join_over_a_communicator_without_a_torch_group_is_refused() -> None:
    opt = OneBitAdam(torch.nn.Linear(3, 2).parameters(), comm=compcoll.SingleComm())
    with pytest.raises(ValueError, match="Join needs an optimizer over a torch.distributed group .* SingleComm"):
        Join([opt])
