"""Checks once that the ranks a state averages over are replicas: they hold the same parameters."""

from __future__ import annotations

import zlib
from typing import Callable, Iterable

import torch

from ..comm import Communicator
from ..errors import RankMismatchError
from .agreement import agree
from .differences import values_option

PARAMETERS = "parameters"
"""The agreement option's name."""


class Replicas:
    """Checks, at the first call a state meets, that the ranks of its group hold the same parameters.

    The ranks a data-parallel average runs over are replicas: DDP's ranks hold the same
    parameters (DDP broadcasts them when it wraps the model, and every step applies the
    same averaged gradients), and so do the ranks that hold one shard in HSDP's replicas. A
    state built on another group (the default group where DDP averages over a subgroup
    beside tensor or pipeline parallelism; replicas that pair different shards) would
    average across ranks that hold other parameters, with nothing said wherever the sizes
    match.

    1. At the first call: a checksum of the parameters it is given (the float64 sum and l2
       norm of each, complex ones as pairs of reals, no float64 copy made), as the CRC-32 of
       their bytes; one host wait, once.
    2. One agreement round on the state's communicator: where the checksums differ,
       ``RankMismatchError`` on every rank, naming which ranks hold which and ``remedy``.
    """

    def __init__(self, owner: str, remedy: str) -> None:
        """``owner``: the state's class name; ``remedy``: what to do, for the error."""
        self.owner = owner
        self.remedy = remedy
        self.checked = False

    def check(self, comm: Communicator, params: Callable[[], Iterable[torch.Tensor]]) -> None:
        """Steps 1-2 on the tensors ``params()`` gives, at the first call only (later calls do not ask for them)."""
        if self.checked:
            return
        reals = [torch.view_as_real(p.detach()) if p.is_complex() else p.detach() for p in params()]
        sums = torch.stack([s for p in reals for s in (p.sum(dtype=torch.float64),
                                                       torch.linalg.vector_norm(p, dtype=torch.float64))])
        code = zlib.crc32(sums.cpu().numpy().tobytes())
        try:
            agree(comm, self.owner, torch.empty(0), None, (values_option(PARAMETERS, {"checksum": code}),))
        except RankMismatchError as exc:
            raise RankMismatchError(f"{self.owner}: the ranks it averages over hold different parameters, where "
                                    f"replicas hold the same ({exc}): {self.remedy}") from exc
        self.checked = True
