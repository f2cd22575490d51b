"""The groups and communicators compcoll makes end with the Communicator that uses them (Gloo, MPI)."""

from __future__ import annotations

import weakref
from functools import partial
from typing import Callable, TypeVar

import torch.distributed as dist

C = TypeVar("C")

RETIRED: list[Callable[[], None]] = []
"""How to end each group or communicator compcoll made whose Communicator is gone; run when compcoll next makes
one (``release_retired``)."""


def owned(comm: C, release: Callable[[], None]) -> C:
    """``comm``, whose group or MPI communicator compcoll made for it alone: ``release`` ends it once ``comm`` is freed.

    torch.distributed keeps every group it made until ``destroy_process_group``, a Gloo group
    holds three threads and a socket to each peer, and an MPI library has room for few
    communicators (MPICH: 2,048, then "Too many communicators"); a state built again and again (a hook or
    an optimizer per training run, a trial per search) would pile them up. So:
    1. When ``comm`` is freed, ``release`` goes to ``RETIRED`` (``weakref.finalize``). The
       finalizer holds ``comm``'s operations in flight (``Communicator._track``), which
       each hold ``comm``: it is freed only with nothing in flight, and a broken
       communicator is never freed (``BROKEN``), so nothing is ended under an unfinished
       operation.
    2. The next group or split compcoll makes runs it (``release_retired``), on the thread
       that builds a state, never from the garbage collector. A peer that ends its side
       first is harmless: a Gloo group with nothing in flight reads nothing from its sockets,
       and ``MPI_Comm_free`` only marks the communicator for deallocation. Only a rank that
       skipped a call its peers made (a job whose peers then time out) could be hurt: their
       messages wait on it under the communicator's context id, which a later communicator
       without those peers may get once it is freed (the test pool ends after such a case).
    NCCL's groups stay until ``destroy_process_group()``: NCCL's teardown waits for every
    member (``ncclCommDestroy``), and ranks free a communicator at different times.
    """
    weakref.finalize(comm, _retire, release, comm._in_flight).atexit = False
    return comm


def release_retired() -> None:
    """End every retired group and communicator. Each is taken off the list before it is ended, so two threads that
    build states at once never end one twice."""
    while True:
        try:
            release = RETIRED.pop()
        except IndexError:
            return
        release()


def new_group(ranks: list[int], backend: str | None = None, local: bool = False) -> dist.ProcessGroup:
    """A new process group of ``ranks`` (global ranks), after ending the retired ones.

    1. End every group and communicator in ``RETIRED`` (``release_retired``).
    2. ``torch.distributed.new_group``: a collective of the default group, or of ``ranks``
       alone where ``local`` (``use_local_synchronization``).
    Every rank that takes part calls it at the same point, on the thread that builds the
    state, so the groups are made, and the retired ones destroyed, in one order on every rank.
    """
    release_retired()
    return dist.new_group(ranks=ranks, backend=backend, use_local_synchronization=local)


def destroyer(group: dist.ProcessGroup) -> Callable[[], None]:
    """``owned``'s ``release`` for a torch.distributed group: destroy it if torch.distributed still holds it. It holds
    the group weakly, so a group that torch.distributed let go of meanwhile (a ``destroy_process_group()`` of the
    default group, or a new job) ends at once."""
    return partial(_destroy, weakref.ref(group))


def _destroy(group: weakref.ref) -> None:
    held = group()
    if held is None:
        return
    try:
        dist.destroy_process_group(held)
    except ValueError:
        pass  # "Invalid process group specified": torch.distributed no longer holds it


def _retire(release: Callable[[], None], in_flight: set) -> None:
    """``owned``'s finalizer: ``in_flight`` is held only to keep the communicator alive while it is not empty."""
    RETIRED.append(release)
