"""Uncompressed float32 averages over ranks that are bit-identical on every rank (fixed summation order)."""

from __future__ import annotations

import torch

from .. import codecs
from ..comm import Communicator
from ..workspace import Workspace


def shard_average(tensor: torch.Tensor, comm: Communicator, shard: int, workspace: Workspace,
                  name: str) -> torch.Tensor:
    """Reduce-scatter: this rank's shard of ``tensor`` averaged over ``comm``, in float32.

    1. The rows to send: a contiguous float32 tensor of ``comm.size`` shards exactly as it is; any other copied, as
       float32, into a buffer of ``comm.size`` shards, zero-padded where it is shorter (a copy of the whole tensor
       and a fill, two torch operators, before 2026-12-05 for every tensor).
    2. All-to-all: rank r receives shard r of every rank.
    3. Sum the rows in rank order, then divide by the number of ranks (``codecs.average_rows``: one kernel).

    Returns a buffer of ``workspace`` (named ``name``) of ``shard`` elements.
    """
    n = comm.size
    numel = tensor.numel()
    if numel == n * shard and tensor.dtype == torch.float32 and tensor.is_contiguous():
        rows = tensor.detach().view(-1)
    else:
        rows = workspace.get(name + ".padded", n * shard, torch.float32, tensor.device)
        rows[:numel].copy_(tensor.reshape(-1))
        if numel < n * shard:
            rows[numel:].zero_()
    received = workspace.get(name + ".shards", n * shard, torch.float32, tensor.device)
    comm.alltoall(rows, received)
    average = workspace.get(name + ".average", shard, torch.float32, tensor.device)
    return codecs.average_rows(received.view(n, shard), average)


def exact_average(
    tensor: torch.Tensor, comm: Communicator, out: torch.Tensor, workspace: Workspace | None = None
) -> torch.Tensor:
    """Average a 1-D float32 ``tensor`` over ``comm`` into ``out``, the same bits on every rank.

    1. ``shard_average``: rank r sums shard r of every rank in rank order and divides by n.
    2. All-gather the averaged shards: straight into ``out`` where it is a contiguous float32 tensor of whole
       shards (``numel`` a multiple of n), else into a buffer, then the first ``numel`` into ``out`` (before
       2026-12-05 always: a copy of the whole tensor more).
    A NaN or Inf on any rank reaches the same elements of every rank's result. Its
    buffers come from ``workspace`` (the caller's; None: fresh ones). ``out`` may be ``tensor`` itself. Bytes sent
    per rank are those of a ring allreduce, 2(n-1)/n * 4 * numel (plus padding to n shards).
    """
    n = comm.size
    numel = tensor.numel()
    shard = -(-numel // n)
    workspace = Workspace() if workspace is None else workspace
    average = shard_average(tensor, comm, shard, workspace, "exact")
    if numel == n * shard and out.dtype == torch.float32 and out.is_contiguous():
        comm.allgather(average, out.view(-1))
        return out
    gathered = workspace.get("exact.gathered", n * shard, torch.float32, tensor.device)
    comm.allgather(average, gathered)
    out.copy_(gathered[:numel])
    return out
