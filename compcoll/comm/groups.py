"""The torch.distributed process groups compcoll makes: each ends with the communicator that uses it (Gloo)."""

from __future__ import annotations

import weakref
from typing import TYPE_CHECKING

import torch.distributed as dist

if TYPE_CHECKING:
    from .torchdist import TorchComm

RETIRED: list[weakref.ref] = []
"""Gloo groups compcoll made whose communicator is gone, destroyed when compcoll next makes a group; held weakly, so
that one torch.distributed let go of meanwhile (a ``destroy_process_group()`` of the default group) ends at once."""


def new_group(ranks: list[int], backend: str | None = None, local: bool = False) -> dist.ProcessGroup:
    """A new process group of ``ranks`` (global ranks), after destroying the retired ones.

    1. Destroy every group in ``RETIRED`` (``destroy_retired``).
    2. ``torch.distributed.new_group``: a collective of the default group, or of ``ranks``
       alone where ``local`` (``use_local_synchronization``).
    Every rank that takes part calls it at the same point, on the thread that builds the
    state, so the groups are made, and the retired ones destroyed, in one order on every rank.
    """
    destroy_retired()
    return dist.new_group(ranks=ranks, backend=backend, use_local_synchronization=local)


def owned(comm: "TorchComm") -> "TorchComm":
    """``comm``, whose group compcoll made for it alone: over Gloo the group retires when ``comm`` is freed.

    torch.distributed keeps every group it made until ``destroy_process_group``, and a Gloo group
    holds three threads and a socket to each peer; a state built again and again (a hook per
    training run, a trial per search) would pile them up. So:
    1. When ``comm`` is freed, its group goes to ``RETIRED`` (``weakref.finalize``). The
       finalizer holds ``comm``'s operations in flight (``Communicator._track``), which
       each hold ``comm``: it is freed only with nothing in flight, and a broken
       communicator is never freed (``BROKEN``), so no group is destroyed under an
       unfinished operation.
    2. The next ``new_group`` destroys it, on the thread that builds a state, never from the
       garbage collector. A peer that destroys its end first is harmless over Gloo: a group
       with nothing in flight reads nothing from its sockets.
    NCCL's groups stay until ``destroy_process_group()``: NCCL's teardown waits for every
    member (``ncclCommDestroy``), and ranks free a communicator at different times.
    """
    if comm.backend == "gloo":
        weakref.finalize(comm, _retire, weakref.ref(comm.group), comm._in_flight).atexit = False
    return comm


def destroy_retired() -> None:
    """Destroy the retired groups that torch.distributed still holds (a ``destroy_process_group()`` of the
    default group, or a new job, destroyed or forgot the others). Each is taken off the list before it is destroyed,
    so two threads that build states at once never destroy one twice."""
    while True:
        try:
            group = RETIRED.pop()()
        except IndexError:
            return
        if group is None:
            continue
        try:
            dist.destroy_process_group(group)
        except ValueError:
            pass  # "Invalid process group specified": torch.distributed no longer holds it


def _retire(group: weakref.ref, in_flight: set) -> None:
    """``owned``'s finalizer: ``in_flight`` is held only to keep the communicator alive while it is not empty."""
    RETIRED.append(group)
