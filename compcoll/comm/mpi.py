"""MPIComm: collectives over mpi4py, non-blocking and polled so that they can time out."""

from __future__ import annotations

import os
import time

import numpy as np
import torch

from ..errors import CollectiveTimeout
from .base import Communicator

_HALF_TYPES = (torch.float16, torch.bfloat16)
_SPIN_S = 0.01
_NAP_S = 1e-4


def _buffer(tensor: torch.Tensor) -> np.ndarray:
    """Zero-copy numpy view of a CPU tensor (16-bit floats as int16, which MPI only moves)."""
    if tensor.dtype in _HALF_TYPES:
        return tensor.view(torch.int16).numpy()
    return tensor.numpy()


class MPIComm(Communicator):
    """A Communicator over an mpi4py communicator (``MPI.COMM_WORLD`` by default).

    Every collective is started non-blocking (``Ialltoall``, ``Iallgather``, ...) and
    polled with ``Test`` until it completes or ``timeout`` seconds pass. Each poll yields
    the core (so oversubscribed ranks let the busy ones run, at no cost to a rank that has
    its own core), and waits longer than 10 ms poll every 0.1 ms.

    Args:
        mpi_comm: an ``mpi4py.MPI.Comm``; None means ``MPI.COMM_WORLD``.
        cuda_aware: whether device buffers may be handed to MPI directly; None detects.
            Only host (CPU) tensors are moved by this version, so it is recorded only.
        timeout: seconds a collective may take; None reads ``COMPCOLL_TIMEOUT`` (300).
    """

    def __init__(self, mpi_comm=None, cuda_aware: bool | None = None, timeout: float | None = None):
        from mpi4py import MPI

        self._mpi = MPI
        self.mpi_comm = MPI.COMM_WORLD if mpi_comm is None else mpi_comm
        self.cuda_aware = bool(cuda_aware)
        super().__init__(self.mpi_comm.Get_rank(), self.mpi_comm.Get_size(), timeout)

    def _wait(self, request, what: str) -> None:
        start = time.monotonic()
        polls = 0
        while not request.Test():
            polls += 1
            os.sched_yield()
            if polls % 64 == 0:
                waited = time.monotonic() - start
                if waited > self.timeout:
                    raise CollectiveTimeout(
                        f"MPI {what} on rank {self.rank} of {self.size} did not complete within "
                        f"{self.timeout:g} s (COMPCOLL_TIMEOUT): did every rank call it with "
                        f"matching arguments, or did a rank fail before reaching it?"
                    )
                if waited > _SPIN_S:
                    time.sleep(_NAP_S)

    def _alltoall(self, send: torch.Tensor, recv: torch.Tensor) -> None:
        self._wait(self.mpi_comm.Ialltoall(_buffer(send), _buffer(recv)), "alltoall")

    def _allgather(self, send: torch.Tensor, recv: torch.Tensor) -> None:
        self._wait(self.mpi_comm.Iallgather(_buffer(send), _buffer(recv)), "allgather")

    def _allreduce(self, tensor: torch.Tensor) -> None:
        work = tensor.float() if tensor.dtype in _HALF_TYPES else tensor
        self._wait(self.mpi_comm.Iallreduce(self._mpi.IN_PLACE, _buffer(work), self._mpi.SUM), "allreduce")
        if work is not tensor:
            tensor.copy_(work)

    def _bcast(self, tensor: torch.Tensor, root: int) -> None:
        self._wait(self.mpi_comm.Ibcast(_buffer(tensor), root), "bcast")

    def _barrier(self) -> None:
        self._wait(self.mpi_comm.Ibarrier(), "barrier")

    def _split(self, color: int, groups: dict[int, list[int]]) -> "MPIComm":
        group = self.mpi_comm.Get_group().Incl(groups[color])
        return MPIComm(self.mpi_comm.Create_group(group), self.cuda_aware, self.timeout)
