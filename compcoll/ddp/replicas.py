"""Checks once that the ranks a DDP hook state averages over are DDP's replicas: they hold the same parameters."""

from __future__ import annotations

import zlib

import torch
import torch.distributed as dist

from ..algorithms.agreement import agree
from ..algorithms.differences import values_option
from ..comm import Communicator
from ..errors import RankMismatchError

PARAMETERS = "parameters"
"""The agreement option's name."""


class Replicas:
    """Checks, at the first bucket a hook state meets, that the ranks of its group hold the same parameters.

    DDP's ranks hold the same parameters (DDP broadcasts them when it wraps the model, and
    every step applies the same averaged gradients). A state built on another group than
    DDP's (the default group, say, where DDP averages over a subgroup beside tensor or
    pipeline parallelism) would average each bucket across ranks that hold other
    parameters, with nothing said wherever the buckets have the same sizes.

    1. At the first bucket: a checksum of its parameters (the float64 sum and l2 norm of
       each, no float64 copy made), as the CRC-32 of their bytes; one host wait, once.
    2. One agreement round on the state's communicator: where the checksums differ,
       ``RankMismatchError`` on every rank, naming which ranks hold which and what to do.
    """

    def __init__(self, owner: str) -> None:
        """``owner``: the state's class name, for the error."""
        self.owner = owner
        self.checked = False

    def check(self, comm: Communicator, bucket: dist.GradBucket) -> None:
        """Steps 1-2, at the first bucket only."""
        if self.checked:
            return
        params = [p.detach() for p in bucket.parameters()]
        sums = torch.stack([s for p in params for s in (p.sum(dtype=torch.float64),
                                                        torch.linalg.vector_norm(p, dtype=torch.float64))])
        code = zlib.crc32(sums.cpu().numpy().tobytes())
        try:
            agree(comm, self.owner, torch.empty(0), None, (values_option(PARAMETERS, {"checksum": code}),))
        except RankMismatchError as exc:
            raise RankMismatchError(
                f"{self.owner}: the ranks it averages over hold different parameters, where DDP's replicas hold the "
                f"same ({exc}): build the state on the group DDP averages over ({self.owner}(process_group=...), "
                f"the group or mesh dimension DDP was given), or, under DDP's init_sync=False, start the replicas "
                f"alike") from exc
        self.checked = True
