"""SingleComm: the size-1 communicator used when no launcher is present."""

from __future__ import annotations

import torch

from .base import Communicator
from .work import DoneWork, Work

_NUMPY = {torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64, torch.float16, torch.float32,
          torch.float64}
"""The dtypes numpy holds (not bfloat16)."""


class SingleComm(Communicator):
    """One process talking to itself; every collective is a copy or nothing, complete when started."""

    carries_meta = True
    agrees_on_device = True
    """Its rounds run where the call's tensors are, as NCCL's (``Communicator.agrees_on_device``): on CUDA tensors
    no pinned staging, host arithmetic or copy up for the server's weights; on host tensors the same rounds on the
    host (one-rank calls on the 2-core machine took the same time either way)."""

    def __init__(self, timeout: float | None = None) -> None:
        super().__init__(rank=0, size=1, timeout=timeout)

    def _start_alltoall(self, send: torch.Tensor, recv: torch.Tensor, blocking: bool) -> Work:
        return DoneWork(copied(send, recv))

    def _start_allgather(self, send: torch.Tensor, recv: torch.Tensor, blocking: bool) -> Work:
        return DoneWork(copied(send, recv))

    def _start_allreduce(self, tensor: torch.Tensor, blocking: bool) -> Work:
        return DoneWork(tensor)

    def _start_bcast(self, tensor: torch.Tensor, root: int, blocking: bool) -> Work:
        return DoneWork(tensor)

    def _start_barrier(self) -> Work:
        return DoneWork()

    def _split(self, color: int, groups: dict[int, list[int]]) -> "SingleComm":
        return SingleComm(timeout=self.timeout)


def copied(send: torch.Tensor, recv: torch.Tensor) -> torch.Tensor:
    """recv <- send, returned: host tensors of a dtype numpy holds by numpy's copy on this thread, where torch's woke
    its thread pool, whose threads then spun on the cores the codecs' next kernels ran on (one-rank calls of 4M
    float32 elements on the 2-core machine, medians of 5 alternations: the DDP hook's default form 29.3 -> 25.0 ms,
    Birder's 27.7 -> 20.8, 4-bit levels 40.4 -> 31.2; and what ``compcoll.bench model`` calibrates its kernel rates
    on); any other by torch's."""
    if send.is_cpu and recv.is_cpu and send.dtype == recv.dtype and send.dtype in _NUMPY:
        recv.detach().numpy()[...] = send.detach().numpy().reshape(recv.shape)
        return recv
    return recv.copy_(send)
