"""SingleComm: the size-1 communicator used when no launcher is present."""

from __future__ import annotations

import torch

from .base import Communicator


class SingleComm(Communicator):
    """One process talking to itself; every collective is a copy or nothing."""

    def __init__(self, timeout: float | None = None) -> None:
        super().__init__(rank=0, size=1, timeout=timeout)

    def _alltoall(self, send: torch.Tensor, recv: torch.Tensor) -> None:
        recv.copy_(send)

    def _allgather(self, send: torch.Tensor, recv: torch.Tensor) -> None:
        recv.copy_(send)

    def _allreduce(self, tensor: torch.Tensor) -> None:
        pass

    def _bcast(self, tensor: torch.Tensor, root: int) -> None:
        pass

    def _barrier(self) -> None:
        pass

    def _split(self, color: int, groups: dict[int, list[int]]) -> "SingleComm":
        return SingleComm(timeout=self.timeout)
