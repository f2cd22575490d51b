"""The Communicator interface: collectives on flat torch tensors, byte accounting, timeouts."""

from __future__ import annotations

import math
import numbers
import os
from abc import ABC, abstractmethod
from typing import Any, Callable

import torch

from ..errors import CommunicatorBroken
from ..recording import current
from ..spec import GATHERED_AGREEMENT_RANKS
from .ordering import Ordering
from .tally import Tally
from .work import Work

DEFAULT_TIMEOUT_S = 300.0
BROKEN: list = []
"""Broken communicators (with the operations they hold in flight) and their unfinished operations, kept for the life of
the process: the transport may still write into the buffers an operation left in flight (an MPI receive that never
completed), which the operation or the communicator's plans own. Every other communicator is freed once nobody
references it."""
HELD_BEFORE_PRUNE = 64
"""Operations a communicator holds in flight (``Communicator._track``) before it looks which of them completed."""
PAIRWISE_BYTES = 4096
"""Host all-gathers of at most this many bytes per rank go as point-to-point pairs where the transport allows
(every call's agreement round among them), so that a timeout can name the ranks whose part never came; up to
``PAIRWISE_RANKS`` ranks."""
PAIRWISE_RANKS = GATHERED_AGREEMENT_RANKS
"""Ranks up to which small host all-gathers go as pairs (``pairs_small``): where an agreement round all-gathers the
ranks' statuses (``spec.GATHERED_AGREEMENT_RANKS``). Pairs are n - 1 sends and receives a rank, n(n - 1) messages a
call; above, the transport's own all-gather (about log2(n) rounds) takes them: the one float64 a summed round
gathers (a scale) among them. MPICH, 8 bytes a rank, 50 calls, medians of 3 on 2 shared cores: 0.09 against 0.05 ms
at 8 ranks, 14.5 against 4.7 at 72, 65.5 against 27.5 at 128."""


def pairs_small(size: int, nbytes: int) -> bool:
    """Whether an all-gather of ``nbytes`` a rank over ``size`` ranks goes as point-to-point pairs: at most
    ``PAIRWISE_BYTES`` on at most ``PAIRWISE_RANKS`` ranks."""
    return nbytes <= PAIRWISE_BYTES and size <= PAIRWISE_RANKS


def seconds(value: Any, what: str) -> float:
    """``value`` as a finite number of seconds above 0, or ValueError naming ``what`` (a timeout of 0, a negative
    one or a string would fail every call, or deep inside one)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not 0 < value < math.inf:
        raise ValueError(f"{what} must be a finite number of seconds above 0, got {value!r}")
    return float(value)


def default_timeout() -> float:
    """Seconds a collective may take: ``COMPCOLL_TIMEOUT`` or 300."""
    text = os.environ.get("COMPCOLL_TIMEOUT")
    if text is None:
        return DEFAULT_TIMEOUT_S
    try:
        return seconds(float(text), "COMPCOLL_TIMEOUT")
    except ValueError:
        raise ValueError(f"COMPCOLL_TIMEOUT must be a finite number of seconds above 0, got {text!r}") from None


class Communicator(ABC):
    """A group of ``size`` processes that move tensors between them.

    Collectives take contiguous 1-D torch tensors. They complete before they return, or,
    with ``async_op=True``, return a ``Work`` at once; either way every collective starts
    in the order this rank issued it (``Ordering``; docs/architecture.md, "Ordering and
    Work"), which is how ranks pair them up.

    Each counts, when it starts, in ``bytes_sent`` the payload bytes this rank sends
    under a bandwidth-optimal schedule: alltoall the (n-1) blocks meant for other ranks,
    allgather (n-1) copies of its own block, allreduce 2(n-1)/n of the tensor (ring),
    bcast the tensor on the root. ``bytes_sent_to[r]`` splits that count by destination
    rank: alltoall block r goes to rank r, allgather sends its block to every peer,
    allreduce and bcast spread their bytes evenly over the peers. A sub-communicator made
    by ``split`` also adds its bytes to its parent's counters (under the parent's rank
    numbers), so the world communicator's counters hold everything a rank sent, and a
    topology can tell intra-node from inter-node bytes.

    ``wait_seconds`` adds up the time this rank's threads spent blocked waiting for
    transport operations to complete (sub-communicators add theirs to their parents' too):
    a call's time less its wait is what it computed, so a benchmark can tell kernels from
    wire.

    A collective that does not finish within ``timeout`` seconds raises
    ``CollectiveTimeout`` and leaves the communicator unusable (``CommunicatorBroken``
    afterwards), since a half-done collective cannot be taken back.

    ``job_rank`` and ``job_size`` are this process's rank among all the job's processes and
    their number (torch.distributed's global rank and world size, MPI's ``COMM_WORLD``), for a
    communicator over a subgroup too: what names a process's checkpoint file, where the group
    ranks of HSDP's replica groups or of data-parallel groups repeat. A communicator made by
    ``split`` keeps its parent's.

    ``attached`` holds, by name, what the layers above keep for this communicator (its
    plans, its topologies): the communicator owns it, so it ends with the communicator
    instead of keeping it alive from a module's table (a Gloo group's threads and sockets
    with it).

    Subclasses implement the underscored methods (starts returning a Work, told whether the caller waits for it at
    once: ``blocking``, which a transport may use to issue it complete in stream order); this class validates, counts
    and orders.
    """

    carries_meta = False
    """Whether this transport takes meta tensors (moving nothing): compcoll's calls on meta tensors then take the CUDA
    path with every kernel launch and host wait counted and none run (``kernels.launch.TRACED``;
    ``scripts/cuda_launches.py``). One rank and the in-process world do; MPI and torch.distributed do not."""

    agrees_on_device = False
    """Whether a call's agreement round runs where its tensors are (``Agreement.check_record``): the record written
    on the device beside the call's sum, all-gathered there, the table read back in the call's one host wait. True
    where the transport moves device tensors itself (NCCL's ``TorchComm``, ``SingleComm``); elsewhere the sum is read
    first and the round runs on host tensors. A transport of host tensors may set it (the in-process world's tests
    do): the same rounds, on host tensors. Every rank sets it alike, between calls; an agreement lays its buffer out
    anew for the round's kind (``Agreement.slot``)."""

    def __init__(self, rank: int, size: int, timeout: float | None = None) -> None:
        self.rank = rank
        self.size = size
        self.job_rank = rank
        self.job_size = size
        self.timeout = default_timeout() if timeout is None else seconds(timeout, "timeout")
        self._tally = Tally(rank, size)
        self._broken: str | None = None
        self._in_flight: set[Work] = set()
        self._prune_at = HELD_BEFORE_PRUNE
        self._ordering = Ordering(self)
        self.attached: dict[str, Any] = {}
        self._peers = [peer for peer in range(size) if peer != rank]

    @property
    def bytes_sent(self) -> int:
        """The payload bytes this rank's collectives and its sub-communicators' counted (see the class)."""
        return self._tally.total

    @property
    def wait_seconds(self) -> float:
        """Seconds this rank's threads spent blocked on transport operations, its sub-communicators' among them (see
        the class)."""
        return self._tally.waited

    @property
    def bytes_sent_to(self) -> list[int]:
        """``bytes_sent`` by destination rank (0 to itself): a list made when read (``tally.Tally.by_rank``)."""
        return self._tally.by_rank()

    def alltoall(self, send: torch.Tensor, recv: torch.Tensor, async_op: bool = False) -> Work | None:
        """Block j of ``send`` goes to rank j; block i of ``recv`` comes from rank i.

        Both tensors hold ``size`` equal blocks. With ``async_op=True`` it returns the
        operation's ``Work`` (``recv`` is complete once it has been waited on).
        """
        self._check(send, recv)
        if send.numel() != recv.numel() or send.numel() % self.size:
            raise ValueError(
                f"alltoall needs equal send/recv sizes divisible by {self.size}, "
                f"got {send.numel()} and {recv.numel()}"
            )
        return self._issue("alltoall", lambda: self._tally.spread((self.size - 1) * (_nbytes(send) // self.size)),
                           lambda blocking: self._start_alltoall(send, recv, blocking), async_op)

    def allgather(self, send: torch.Tensor, recv: torch.Tensor, async_op: bool = False) -> Work | None:
        """Block i of ``recv`` receives rank i's ``send`` (``async_op``: as for ``alltoall``)."""
        self._check(send, recv)
        if recv.numel() != send.numel() * self.size:
            raise ValueError(
                f"allgather needs recv of {self.size} x {send.numel()} elements, got {recv.numel()}"
            )
        return self._issue("allgather", lambda: self._tally.spread((self.size - 1) * _nbytes(send)),
                           lambda blocking: self._start_allgather(send, recv, blocking), async_op)

    def allreduce(self, tensor: torch.Tensor, async_op: bool = False) -> Work | None:
        """Sum ``tensor`` over all ranks, in place (``async_op``: as for ``alltoall``)."""
        self._check(tensor)
        ring = 2 * (self.size - 1) * _nbytes(tensor) // self.size
        return self._issue("allreduce", lambda: self._tally.spread(ring),
                           lambda blocking: self._start_allreduce(tensor, blocking), async_op)

    def bcast(self, tensor: torch.Tensor, root: int = 0, async_op: bool = False) -> Work | None:
        """Copy ``tensor`` from rank ``root`` to every rank, in place (``async_op``: as for ``alltoall``)."""
        self._check(tensor)
        if not 0 <= root < self.size:
            raise ValueError(f"bcast root {root} is not a rank of a size-{self.size} communicator")

        def count() -> None:
            if self.rank == root:
                self._tally.spread(_nbytes(tensor))

        return self._issue("bcast", count, lambda blocking: self._start_bcast(tensor, root, blocking), async_op)

    def barrier(self, async_op: bool = False) -> Work | None:
        """Return once every rank has called barrier (``async_op``: as for ``alltoall``)."""
        return self._issue("barrier", lambda: None, lambda _: self._start_barrier(), async_op)

    def split(self, color: int, key: int | None = None) -> "Communicator":
        """Sub-communicator of the ranks that pass the same ``color``, ordered by (key, rank).

        1. Allgather every rank's (color, key) and group the ranks by color.
        2. Let the transport build the group of this rank's color.
        3. Link it to this communicator, so its bytes count here too, and share its
           ordering, so the two never issue collectives out of this rank's order.
        """
        def build() -> "Communicator":
            groups = self._color_groups(int(color), self.rank if key is None else int(key))
            child = self._guard(self._split, int(color), groups)
            self._tally.adopt(child._tally, groups[int(color)])
            child.job_rank, child.job_size = self.job_rank, self.job_size
            child._ordering = self._ordering
            return child

        return self._ordering.run(build, "split")

    def run(self, call: Callable[[], Any], what: str, async_op: bool = False) -> Any:
        """Run ``call`` (a whole algorithm on this communicator) in this rank's order of collectives.

        Blocking: in its turn, on this thread when nothing is queued; returns its result.
        ``async_op=True``: queued for this communicator's ordering thread; returns its
        ``TaskWork`` (``wait`` gives the result or raises the call's error). Either way a
        communicator already broken raises ``CommunicatorBroken`` at once.
        """
        self._check()
        if async_op:
            return self._ordering.submit(call, what)
        return self._ordering.run(call, what)

    def submit(self, call: Callable[[], Any], what: str, on_wait: Callable[[Any], None] | None = None) -> Work:
        """Queue ``call`` for this communicator's ordering thread; ``on_wait`` runs in the waiter (see TaskWork)."""
        return self._ordering.submit(call, what, on_wait)

    def describe(self) -> str:
        """The transport's name for messages ("MPI", "torch.distributed (gloo)", ...)."""
        return type(self).__name__

    def _check_threads(self) -> None:
        """Raise if this transport may not be entered from the ordering thread (every one may here)."""

    def _issue(self, what: str, count: Callable[[], None], start: Callable[[bool], Work], async_op: bool
               ) -> Work | None:
        """Start a transport operation in its turn: check, count its bytes, start; wait unless ``async_op``.

        ``start(blocking)`` starts it; ``blocking`` (not ``async_op``) tells the transport that its Work is waited
        for at once (``TorchComm.in_stream_order``).

        A communicator already broken raises at once, before queueing behind calls still in flight (one that
        timed out in ``wait(timeout)`` may run on for its whole timeout). While the thread records a call's device
        part (``recording``), the operation is one of its steps.
        """
        recording = current()
        if recording is not None:
            return recording.collective(self._issue_now, what, count, start, async_op)
        return self._issue_now(what, count, start, async_op)

    def _issue_now(self, what: str, count: Callable[[], None], start: Callable[[bool], Work], async_op: bool
                   ) -> Work | None:
        """``_issue``, unrecorded."""
        self._check()

        def begin() -> Work:
            self._check()
            count()
            try:
                return start(not async_op)
            except Exception as exc:
                self._mark_broken(exc)
                raise

        work = self._ordering.start(begin, what)
        if async_op:
            return work
        work.wait()
        return None

    def _count_wait(self, seconds: float) -> None:
        """Add ``seconds`` spent blocked on a transport operation here and in every parent (``Tally.wait``)."""
        self._tally.wait(seconds)

    def _check(self, *tensors: torch.Tensor) -> None:
        if self._broken:
            raise CommunicatorBroken(
                f"this communicator is unusable since an earlier collective failed: {self._broken}"
            )
        for t in tensors:
            if t.dim() != 1 or not t.is_contiguous():
                raise ValueError(f"collectives take contiguous 1-D tensors, got shape {tuple(t.shape)}")

    def _guard(self, op: Callable[..., Any], *args: Any) -> Any:
        """Run a transport step; an error in it leaves the communicator broken."""
        self._check()
        try:
            return op(*args)
        except Exception as exc:
            self._mark_broken(exc)
            raise

    def _track(self, work: Work, started: bool) -> None:
        """Hold ``work`` while it is in flight (``started``), let it go once it completed.

        The communicator owns its operations until they complete, whoever dropped their handles: the transport
        writes into their buffers until then (over Gloo, a receive freed before its data came would leave the data
        in the socket, and Gloo's event loop would poll that socket at full speed for the life of the process).
        1. Started: add it. Completed (``PendingWork._complete``): remove it.
        2. When the held operations reach ``_prune_at`` (``HELD_BEFORE_PRUNE`` at first), test each one
           (``is_completed``, which removes those done), then set ``_prune_at`` to twice what is left: handles
           dropped without a wait (fire and forget) cost each call O(1) on average, not memory for ever.
        """
        if not started:
            self._in_flight.discard(work)
            return
        self._in_flight.add(work)
        if len(self._in_flight) >= self._prune_at:
            for held in list(self._in_flight):
                if held is not work:
                    held.is_completed()
            self._prune_at = max(HELD_BEFORE_PRUNE, 2 * len(self._in_flight))

    @property
    def broken(self) -> str | None:
        """Why this communicator refuses every call (the error of the collective that failed: ``CommunicatorBroken``
        says it), or None while it is usable."""
        return self._broken

    def _mark_broken(self, exc: BaseException, unfinished: Work | None = None) -> None:
        """Refuse every later call with ``exc``; keep this communicator, with the operations it holds in flight
        (``_track``), and the operation that did not finish, for the life of the process (``BROKEN``)."""
        if self._broken is None:
            self._broken = f"{type(exc).__name__}: {exc}"
            BROKEN.append(self)
        if unfinished is not None:
            BROKEN.append(unfinished)

    def _color_groups(self, color: int, key: int) -> dict[int, list[int]]:
        """Every color's ranks, each ordered by (key, rank): an allgather of (color, key)."""
        mine = torch.tensor([color, key], dtype=torch.int64)
        table = torch.empty(2 * self.size, dtype=torch.int64)
        self.allgather(mine, table)
        groups: dict[int, list[tuple[int, int]]] = {}
        for r, (c, k) in enumerate(table.view(self.size, 2).tolist()):
            groups.setdefault(c, []).append((k, r))
        return {c: [r for _, r in sorted(members)] for c, members in sorted(groups.items())}

    @abstractmethod
    def _start_alltoall(self, send: torch.Tensor, recv: torch.Tensor, blocking: bool) -> Work: ...

    @abstractmethod
    def _start_allgather(self, send: torch.Tensor, recv: torch.Tensor, blocking: bool) -> Work: ...

    @abstractmethod
    def _start_allreduce(self, tensor: torch.Tensor, blocking: bool) -> Work: ...

    @abstractmethod
    def _start_bcast(self, tensor: torch.Tensor, root: int, blocking: bool) -> Work: ...

    @abstractmethod
    def _start_barrier(self) -> Work: ...

    @abstractmethod
    def _split(self, color: int, groups: dict[int, list[int]]) -> "Communicator":
        """The communicator of ``groups[color]`` (every color's ranks, in order)."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}(rank={self.rank}, size={self.size})"


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()
