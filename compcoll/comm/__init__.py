"""Transports: Communicator and its MPI, torch.distributed, in-process and single-process forms, and init()."""

from __future__ import annotations

import os
from typing import Any
from collections.abc import Mapping
from datetime import timedelta

from .base import Communicator, default_timeout, seconds
from .launched import launched_by_mpi, launched_by_torchrun
from .local import LocalComm, local_world
from .single import SingleComm

_default: Communicator | None = None

__all__ = ["Communicator", "LocalComm", "SingleComm", "MPIComm", "TorchComm", "init", "get_default", "local_world",
           "set_default"]


def __getattr__(name: str) -> Any:
    if name == "MPIComm":
        from .mpi import MPIComm

        return MPIComm
    if name == "TorchComm":
        from .torchdist import TorchComm

        return TorchComm
    raise AttributeError(name)


def _torch_initialised() -> bool:
    import torch.distributed as dist

    return dist.is_available() and dist.is_initialized()


TORCH_BACKEND_ENV = "COMPCOLL_TORCH_BACKEND"


def init(backend: str | None = None, timeout: float | None = None) -> Communicator:
    """Create the default communicator from the environment and return it.

    1. ``backend="mpi" | "torch" | "single"`` forces a kind; otherwise:
    2. an initialised torch.distributed -> TorchComm on its WORLD group;
    3. a process torchrun started (``launched.launched_by_torchrun``) -> step 5's TorchComm,
       whatever MPI variables an outer launcher left it (``srun torchrun ...`` under Slurm's
       pmi2 plugin: ``PMI_SIZE``);
    4. MPI launcher variables (mpiexec, srun: PMI_SIZE, OMPI_COMM_WORLD_SIZE, ...) -> MPIComm;
    5. torchrun variables (RANK, WORLD_SIZE, MASTER_ADDR) -> init_process_group (the
       backend of ``torch_backend``: ``COMPCOLL_TORCH_BACKEND`` if set, else NCCL where
       each local rank has a GPU (its ``LOCAL_RANK``), else Gloo; an NCCL group's timeout
       is ``timeout``, which bounds its collectives) and TorchComm;
    6. srun (SLURM_NTASKS > 1) -> MPIComm;
    7. otherwise a SingleComm of size 1.
    Under MPI it also makes an uncaught exception on any rank end the job at once
    (``abort.install_abort_hook``; ``COMPCOLL_MPI_ABORT=0`` opts out).
    """
    global _default
    kind = backend or (
        "torch" if _torch_initialised() or launched_by_torchrun(os.environ)
        else "mpi" if launched_by_mpi(os.environ)
        else "torch" if "WORLD_SIZE" in os.environ and "MASTER_ADDR" in os.environ
        else "mpi" if launched_by_mpi(os.environ, ("SLURM_NTASKS",))
        else "single"
    )
    if kind == "mpi":
        from .abort import install_abort_hook
        from .mpi import MPIComm

        _default = MPIComm(timeout=timeout)
        install_abort_hook()
    elif kind == "torch":
        _default = _init_torch(timeout)
    elif kind == "single":
        _default = SingleComm(timeout=timeout)
    else:
        raise ValueError(f"compcoll.init: unknown backend {backend!r}; use 'mpi', 'torch' or 'single'")
    return _default


def torch_backend(env: Mapping[str, str], cuda_available: bool, gpus: int) -> str:
    """The torch.distributed backend ``init`` opens under torchrun.

    1. ``COMPCOLL_TORCH_BACKEND`` if set. NCCL then needs a GPU for each of the node's ranks
       (``LOCAL_WORLD_SIZE``), else a RuntimeError names what is missing (NCCL's own error
       would be "Duplicate GPU detected", or no GPU at all).
    2. Otherwise NCCL where CUDA is available and every local rank has a GPU of its own, else
       Gloo (more ranks on a node than GPUs, as ``torchrun --nproc-per-node 4`` on one GPU).
    """
    local_ranks = int(env.get("LOCAL_WORLD_SIZE", "1"))
    chosen = env.get(TORCH_BACKEND_ENV)
    if chosen == "nccl" and not cuda_available:
        raise RuntimeError(
            f"compcoll.init: the NCCL backend ({TORCH_BACKEND_ENV}=nccl) needs a CUDA GPU, and torch sees "
            f"none (torch.cuda.is_available() is False); use {TORCH_BACKEND_ENV}=gloo on CPUs"
        )
    if chosen == "nccl" and local_ranks > gpus:
        raise RuntimeError(
            f"compcoll.init: the NCCL backend ({TORCH_BACKEND_ENV}=nccl) needs a GPU for each of this node's "
            f"{local_ranks} ranks (LOCAL_WORLD_SIZE), and torch sees {gpus}; use {TORCH_BACKEND_ENV}=gloo, or "
            f"fewer ranks per node"
        )
    if chosen:
        return chosen
    return "nccl" if cuda_available and local_ranks <= gpus else "gloo"


def _init_torch(timeout: float | None) -> Communicator:
    import torch
    import torch.distributed as dist

    from .torchdist import TorchComm

    if not dist.is_initialized():
        backend = torch_backend(os.environ, torch.cuda.is_available(), torch.cuda.device_count())
        if backend == "nccl":
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
            bound = default_timeout() if timeout is None else seconds(timeout, "timeout")  # NCCL's watchdog
            dist.init_process_group(backend, timeout=timedelta(seconds=bound))
        else:
            dist.init_process_group(backend)
    return TorchComm(timeout=timeout)


def shutdown() -> None:
    """Close what ``init()`` opened: destroy the torch.distributed process group, if one is open.

    Call it at the end of a torchrun job. A Gloo process group left to the interpreter's
    exit can abort in its C++ teardown ("terminate called without an active exception").
    The group and its threads end here unless something outside compcoll still holds it
    (a DDP model's reducer: let the model go first); compcoll's communicators hold their
    group weakly, and refuse calls once it is destroyed. MPI finalizes itself at exit.
    """
    global _default
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()
    _default = None


def get_default() -> Communicator:
    """The default communicator, made by ``init()`` on first use."""
    return _default if _default is not None else init()


def communicator(comm: Any, what: str) -> Communicator:
    """``comm`` as the communicator of ``what`` (a call or an optimizer): ``get_default()`` for None, a
    ``Communicator`` as it is.

    Raises:
        TypeError: anything else, naming it and the wrapper that makes a communicator of it, once (its plans,
            buffers and ordering thread live with it): ``TorchComm(group)`` for a torch.distributed process group
            or a 1-D DeviceMesh's ``get_group()``, ``MPIComm(comm)`` for an mpi4py communicator. Before 2026-12-03 a
            process group failed deep inside (``'>' not supported between instances of 'method' and 'int'``).
    """
    if comm is None:
        return get_default()
    if isinstance(comm, Communicator):
        return comm
    raise TypeError(f"{what}: comm must be a compcoll Communicator or None (compcoll.get_default()), got "
                    f"{type(comm).__module__}.{type(comm).__name__}: make one once and keep it, "
                    f"compcoll.TorchComm(group) for a torch.distributed process group (a DeviceMesh: its "
                    f"get_group()), compcoll.MPIComm(comm) for an mpi4py communicator")


def set_default(comm: Communicator) -> None:
    """Make ``comm`` the communicator used where ``comm=None`` is passed."""
    global _default
    _default = comm
