"""Uneven inputs: what an optimizer does under ``torch.distributed.algorithms.join.Join`` once its rank has joined."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from torch.distributed.algorithms.join import JoinHook

from ..comm import Communicator

if TYPE_CHECKING:
    from .base import CompressedOptimizer


class ShadowSteps(JoinHook):
    """The join hook of a compcoll optimizer: while other ranks still step, this rank steps with them on zeros.

    1. ``main_hook``, once per step the ranks that have not joined take: the optimizer's own
       step on a zero gradient (``CompressedOptimizer._shadow_step``), so every collective of
       that step meets its peers' and the ranks that joined keep identical replicas.
    2. The average divides by all ranks, joined ones included (DDP's
       ``divide_by_initial_world_size=True``, its default).
    """

    def __init__(self, optimizer: CompressedOptimizer) -> None:
        """``optimizer``: the joined rank's optimizer."""
        self.optimizer = optimizer

    def main_hook(self) -> None:
        """Step 1: one shadow step, for the step the ranks still in are taking."""
        self.optimizer._shadow_step()


def join_process_group(comm: Communicator, what: str) -> Any:
    """The torch.distributed group ``comm`` sends over, which ``Join`` counts joined ranks on; ValueError for a
    communicator of another transport (Join's own collectives are torch.distributed's)."""
    group = getattr(comm, "group", None)
    if group is None:
        raise ValueError(f"{what}: torch.distributed's Join needs an optimizer over a torch.distributed group "
                         f"(compcoll.TorchComm); this one sends over {type(comm).__name__}")
    return group


def join_device(comm: Communicator) -> torch.device:
    """The device ``Join``'s counts live on: the communicator's (CUDA for NCCL, else the CPU)."""
    return getattr(comm, "device", torch.device("cpu"))
