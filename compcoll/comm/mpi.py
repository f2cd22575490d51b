"""MPIComm: collectives over mpi4py, non-blocking and polled so that they can time out."""

from __future__ import annotations

import os
import time

import numpy as np
import torch

from ..errors import CollectiveTimeout
from .base import Communicator
from .cuda_aware import detect_cuda_aware

_HALF_TYPES = (torch.float16, torch.bfloat16)
_SPIN_S = 0.01
_NAP_S = 1e-4


def _buffer(tensor: torch.Tensor) -> np.ndarray:
    """Zero-copy numpy view of a CPU tensor (16-bit floats as int16, which MPI only moves)."""
    if tensor.dtype in _HALF_TYPES:
        return tensor.view(torch.int16).numpy()
    return tensor.numpy()


class DeviceBuffer:
    """A flat tensor's memory described by ``__cuda_array_interface__``: what mpi4py hands a CUDA-aware MPI.

    16-bit floats are described as int16 (MPI only moves them). The stream is None: the
    caller synchronises the producing stream before MPI sees the pointer.
    """

    def __init__(self, tensor: torch.Tensor) -> None:
        dtype = torch.int16 if tensor.dtype in _HALF_TYPES else tensor.dtype
        self.__cuda_array_interface__ = {
            "shape": (tensor.numel(),),
            "typestr": np.dtype(torch.empty(0, dtype=dtype).numpy().dtype).str,
            "data": (tensor.data_ptr(), False),
            "strides": None,
            "stream": None,
            "version": 3,
        }


class MPIComm(Communicator):
    """A Communicator over an mpi4py communicator (``MPI.COMM_WORLD`` by default).

    Every collective is started non-blocking (``Ialltoall``, ``Iallgather``, ...) and
    polled with ``Test`` until it completes or ``timeout`` seconds pass. Each poll yields
    the core (so oversubscribed ranks let the busy ones run, at no cost to a rank that has
    its own core), and waits longer than 10 ms poll every 0.1 ms.

    Args:
        mpi_comm: an ``mpi4py.MPI.Comm``; None means ``MPI.COMM_WORLD``.
        cuda_aware: whether CUDA tensors go to MPI as device pointers; None detects it
            (``COMPCOLL_CUDA_AWARE``, else ``MPIX_Query_cuda_support`` of the loaded
            libmpi). Otherwise they are staged through host buffers (pinned when CUDA is
            available), kept and reused across calls.
        timeout: seconds a collective may take; None reads ``COMPCOLL_TIMEOUT`` (300).
    """

    def __init__(self, mpi_comm=None, cuda_aware: bool | None = None, timeout: float | None = None):
        from mpi4py import MPI

        self._mpi = MPI
        self.mpi_comm = MPI.COMM_WORLD if mpi_comm is None else mpi_comm
        self.cuda_aware = detect_cuda_aware() if cuda_aware is None else bool(cuda_aware)
        self._staging: dict[tuple[str, torch.dtype], torch.Tensor] = {}
        super().__init__(self.mpi_comm.Get_rank(), self.mpi_comm.Get_size(), timeout)

    def _is_device(self, tensor: torch.Tensor) -> bool:
        """Whether ``tensor`` lives in device memory (the CUDA-aware or staged path)."""
        return tensor.device.type == "cuda"

    def _stage(self, name: str, tensor: torch.Tensor, copy_in: bool) -> torch.Tensor:
        """The host buffer ``name`` for ``tensor`` (grown, never shrunk), filled from it if ``copy_in``."""
        key = (name, tensor.dtype)
        host = self._staging.get(key)
        if host is None or host.numel() < tensor.numel():
            host = torch.empty(tensor.numel(), dtype=tensor.dtype, pin_memory=torch.cuda.is_available())
            self._staging[key] = host
        host = host[:tensor.numel()]
        if copy_in:
            host.copy_(tensor)
        return host

    def _run(self, what: str, start, send: torch.Tensor | None, recv: torch.Tensor) -> None:
        """Start ``start(send_buffer, recv_buffer)`` and wait for it, moving device tensors as this MPI can.

        1. Host tensors: zero-copy numpy views.
        2. Device tensors, CUDA-aware MPI: synchronise the current CUDA stream (the data
           must be complete), then pass the device pointers (``DeviceBuffer``).
        3. Device tensors otherwise: copy into reused host buffers, run on those, copy the
           result back.
        """
        tensors = [t for t in (send, recv) if t is not None]
        if not any(self._is_device(t) for t in tensors):
            self._wait(start(None if send is None else _buffer(send), _buffer(recv)), what)
            return
        if self.cuda_aware:
            if torch.cuda.is_available():
                torch.cuda.current_stream().synchronize()
            self._wait(start(None if send is None else DeviceBuffer(send), DeviceBuffer(recv)), what)
            return
        host_send = None if send is None else self._stage("send", send, True)
        host_recv = self._stage("recv", recv, send is None)
        self._wait(start(None if host_send is None else _buffer(host_send), _buffer(host_recv)), what)
        recv.copy_(host_recv)

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
        self._run("alltoall", self.mpi_comm.Ialltoall, send, recv)

    def _allgather(self, send: torch.Tensor, recv: torch.Tensor) -> None:
        self._run("allgather", self.mpi_comm.Iallgather, send, recv)

    def _allreduce(self, tensor: torch.Tensor) -> None:
        work = tensor.float() if tensor.dtype in _HALF_TYPES else tensor
        in_place = self._mpi.IN_PLACE
        self._run("allreduce", lambda _, buf: self.mpi_comm.Iallreduce(in_place, buf, self._mpi.SUM), None, work)
        if work is not tensor:
            tensor.copy_(work)

    def _bcast(self, tensor: torch.Tensor, root: int) -> None:
        self._run("bcast", lambda _, buf: self.mpi_comm.Ibcast(buf, root), None, tensor)

    def _barrier(self) -> None:
        self._wait(self.mpi_comm.Ibarrier(), "barrier")

    def _split(self, color: int, groups: dict[int, list[int]]) -> "MPIComm":
        group = self.mpi_comm.Get_group().Incl(groups[color])
        return MPIComm(self.mpi_comm.Create_group(group), self.cuda_aware, self.timeout)
