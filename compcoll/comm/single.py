"""SingleComm: the size-1 communicator used when no launcher is present."""

from __future__ import annotations

import torch

from .base import Communicator
from .work import DoneWork, Work


class SingleComm(Communicator):
    """One process talking to itself; every collective is a copy or nothing, complete when started."""

    carries_meta = True

    def __init__(self, timeout: float | None = None) -> None:
        super().__init__(rank=0, size=1, timeout=timeout)

    def _start_alltoall(self, send: torch.Tensor, recv: torch.Tensor) -> Work:
        return DoneWork(recv.copy_(send))

    def _start_allgather(self, send: torch.Tensor, recv: torch.Tensor) -> Work:
        return DoneWork(recv.copy_(send))

    def _start_allreduce(self, tensor: torch.Tensor) -> Work:
        return DoneWork(tensor)

    def _start_bcast(self, tensor: torch.Tensor, root: int) -> Work:
        return DoneWork(tensor)

    def _start_barrier(self) -> Work:
        return DoneWork()

    def _split(self, color: int, groups: dict[int, list[int]]) -> "SingleComm":
        return SingleComm(timeout=self.timeout)
