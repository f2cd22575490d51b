"""Rank-side bodies of the FlatParams tests that need ranks: torch's ZeroRedundancyOptimizer refused."""

from __future__ import annotations

import torch
from torch.distributed.optim import ZeroRedundancyOptimizer

import compcoll
from compcoll.optim import OneBitAdam


def zero_redundancy_is_refused(comm: compcoll.Communicator) -> None:
    """A 1-bit Adam as ZeroRedundancyOptimizer's local optimizer, over two layers alike in shape (rank 0's shard one,
    rank 1's the other): ValueError on every rank, naming it, and no parameter changed. (The layout agreement
    passed, rank 1's layer took rank 0's weights at construction, and the ranks averaged different layers.)"""
    torch.manual_seed(comm.rank)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8, bias=False), torch.nn.Linear(8, 8, bias=False))
    before = [p.detach().clone() for p in model.parameters()]
    try:
        ZeroRedundancyOptimizer(model.parameters(), optimizer_class=OneBitAdam, lr=1e-3, comm=comm)
    except ValueError as exc:
        assert "built by torch's ZeroRedundancyOptimizer" in str(exc), exc
    else:
        raise AssertionError("ZeroRedundancyOptimizer built a 1-bit Adam over its shard")
    assert all(map(torch.equal, model.parameters(), before)), "a parameter changed"
