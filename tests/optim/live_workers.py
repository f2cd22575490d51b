"""Rank-side bodies of the live-mask tests (run by compcoll.launcher)."""

from __future__ import annotations

import torch

import compcoll
from compcoll.optim.live import add_fresh, any_rank


def _mask(rank: int, numel: int, density: float) -> torch.Tensor:
    gen = torch.Generator().manual_seed(31 * rank + numel)
    return torch.rand(numel, generator=gen) < density


def union(comm: compcoll.Communicator, numel: int, density: float) -> None:
    """any_rank and add_fresh (indices or masks) give the OR of every rank's mask, on every rank."""
    masks = [_mask(r, numel, density) for r in range(comm.size)]
    expected = torch.stack(masks).any(dim=0)
    assert torch.equal(any_rank(masks[comm.rank], comm), expected)
    live = _mask(99, numel, density)
    seen = masks[comm.rank] | live
    counts = [int((m | live).logical_and(~live).sum()) for m in masks]
    sent = comm.bytes_sent
    add_fresh(live, seen, counts, comm)
    assert torch.equal(live, expected | _mask(99, numel, density))
    most = max(counts)
    if 32 * most < numel:
        assert comm.bytes_sent - sent == (comm.size - 1) * 4 * most, "indices should have been sent"
