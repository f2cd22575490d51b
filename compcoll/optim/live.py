"""Which coordinates some rank has seen a gradient for: a bitwise OR of boolean masks across ranks."""

from __future__ import annotations

import torch

from ..comm import Communicator

_BIT_WEIGHTS = (128, 64, 32, 16, 8, 4, 2, 1)


def any_rank(mask: torch.Tensor, comm: Communicator) -> torch.Tensor:
    """The element-wise OR of every rank's boolean vector ``mask`` (same length on every rank).

    1. Pack the mask into bytes, 8 elements per byte, first element in the top bit.
    2. All-gather the packed masks ((n-1) * numel/8 bytes sent per rank).
    3. OR the rows together and unpack.
    """
    numel = mask.numel()
    padded = torch.zeros(-(-numel // 8) * 8, dtype=torch.uint8, device=mask.device)
    padded[:numel] = mask
    weights = torch.tensor(_BIT_WEIGHTS, dtype=torch.uint8, device=mask.device)
    packed = (padded.view(-1, 8) * weights).sum(dim=1, dtype=torch.uint8)
    gathered = torch.empty(comm.size * packed.numel(), dtype=torch.uint8, device=mask.device)
    comm.allgather(packed, gathered)
    rows = gathered.view(comm.size, -1)
    union = rows[0].clone()
    for row in rows[1:]:
        union |= row
    return (union.view(-1, 1) & weights).ne(0).view(-1)[:numel]


def add_fresh(live: torch.Tensor, seen: torch.Tensor, counts: list[int], comm: Communicator) -> None:
    """live |= every rank's ``seen``, given every rank's count of seen coordinates not yet in ``live``.

    1. If the largest count c is small (4c bytes below numel/8), every rank all-gathers the
       indices of its new coordinates, padded with -1 to c: (n-1)*4c bytes per rank.
    2. Otherwise the whole masks travel, 1 bit per element (``any_rank``).
    Every rank holds the same ``live`` afterwards, which only grows.
    """
    most = max(counts)
    if 4 * most * 8 < live.numel():
        fresh = (seen & ~live).nonzero().view(-1).to(torch.int32)
        send = torch.full((most,), -1, dtype=torch.int32, device=live.device)
        send[:fresh.numel()] = fresh
        gathered = torch.empty(comm.size * most, dtype=torch.int32, device=live.device)
        comm.allgather(send, gathered)
        live[gathered[gathered >= 0].long()] = True
    else:
        live |= any_rank(seen, comm)
