"""LocalComm: n ranks of one world in this process, one thread each, moving the same bytes as MPI and Gloo."""

from __future__ import annotations

import threading
from abc import abstractmethod
from collections import deque

import torch

from ..errors import CommunicatorBroken, RankMismatchError
from .base import Communicator
from .work import PendingWork, Work


class Fabric:
    """The wires of one in-process world: for every ordered pair of ranks, its messages and its posted receives.

    As on MPI's point-to-point channels, a pair's messages match its receives in the order
    both were issued: every rank issues its collectives in the same order, so the i-th
    message from rank a to rank b lands in the i-th receive b posted for a, whichever
    call waits first. One lock guards the world's queues; each rank has its own condition
    on it (``arrived[rank]``), so the message that completes a collective wakes only the threads of the rank it is
    for, and the others wake none.

    A message lands only in a receive of its dtype and length: calls out of step (one rank's all-to-all paired
    with another's allgather, say) raise ``RankMismatchError`` naming both, where MPI or Gloo could move the bytes
    or wait. ``end`` ends the world and every sub-world split from it, as MPI_Abort ends a job.
    """

    def __init__(self, size: int, root: "Fabric | None" = None) -> None:
        self.size = size
        self.root = root or self
        self.lock = threading.Lock()
        self.arrived = [threading.Condition(self.lock) for _ in range(size)]
        self.messages = [[deque() for _ in range(size)] for _ in range(size)]
        self.receives = [[deque() for _ in range(size)] for _ in range(size)]
        self.reductions: dict[int, Reduction] = {}
        self.children: dict[tuple, Fabric] = {}
        self.ended: str | None = None

    def post(self, source: int, payloads: dict[int, torch.Tensor], what: str) -> None:
        """Send ``payloads[dest]`` of ``source``'s collective ``what`` to each ``dest``: copied into its oldest
        posted receive, else a copy queued; under one hold of the lock, waking a receiving rank only where its
        collective is now complete (woken by every block, the two calls of 256 ranks in ``tests/comm/test_local.py``
        took 10.2 s, now 8.2 s). A receive that does not fit its message raises before anything moves."""
        if any(payload.is_cuda for payload in payloads.values()):
            payloads = {dest: payload.clone() for dest, payload in payloads.items()}
            for payload in payloads.values():
                torch.cuda.current_stream(payload.device).synchronize()
        with self.lock:
            for dest, payload in payloads.items():
                waiting = self.receives[source][dest]
                if waiting:
                    _check_fit(source, dest, payload, what, waiting[0])
            for dest, payload in payloads.items():
                waiting = self.receives[source][dest]
                if waiting:
                    slot = waiting.popleft()
                    slot.fill(payload)
                    if slot.work.missing == 0:
                        self.arrived[dest].notify_all()
                else:
                    self.messages[source][dest].append((payload if payload.is_cuda else payload.clone(), what))

    def expect(self, dest: int, slots: dict[int, "Slot"]) -> None:
        """Post ``slots[source]`` as ``dest``'s receive of its next message from each ``source`` (filled now where
        it has arrived), under one hold of the lock; a queued message that does not fit raises before anything
        moves."""
        with self.lock:
            for source, slot in slots.items():
                queued = self.messages[source][dest]
                if queued:
                    _check_fit(source, dest, *queued[0], slot)
            for source, slot in slots.items():
                queued = self.messages[source][dest]
                if queued:
                    slot.fill(queued.popleft()[0])
                else:
                    self.receives[source][dest].append(slot)

    def end(self, reason: str) -> None:
        """End this world and its sub-worlds: each collective waiting in one, or started later, raises
        ``CommunicatorBroken`` naming ``reason`` (the first reason given stays)."""
        with self.lock:
            if self.ended is None:
                self.ended = reason
            for arrived in self.arrived:
                arrived.notify_all()
            children = list(self.children.values())
        for child in children:
            child.end(reason)

    def reduce(self, call: int, rank: int, tensor: torch.Tensor) -> "Reduction":
        """Add ``rank``'s copy of ``tensor`` to the world's allreduce number ``call``; the rank that completes it
        sums the copies in rank order, once for every rank, and wakes them all."""
        copy = tensor.clone()
        if copy.is_cuda:
            torch.cuda.current_stream(copy.device).synchronize()
        with self.lock:
            reduction = self.reductions.setdefault(call, Reduction(self.size))
            reduction.parts[rank] = copy
            reduction.missing -= 1
            if reduction.missing == 0:
                total = reduction.parts[0].clone()
                for part in reduction.parts[1:]:
                    total += part
                reduction.total = total
                for arrived in self.arrived:
                    arrived.notify_all()
        return reduction

    def collect(self, call: int, reduction: "Reduction") -> torch.Tensor:
        """The sum of allreduce ``call``; the last rank to collect it frees it."""
        with self.lock:
            reduction.readers -= 1
            if reduction.readers == 0:
                del self.reductions[call]
        return reduction.total

    def child(self, key: tuple, size: int) -> "Fabric":
        """The fabric of a sub-world, the same object for every member that asks with ``key``."""
        with self.lock:
            found = self.children.get(key)
            if found is None:
                found = self.children[key] = Fabric(size, self.root)
                found.ended = self.ended
            return found


def _check_fit(source: int, dest: int, payload: torch.Tensor, what: str, slot: "Slot") -> None:
    """Raise ``RankMismatchError`` unless rank ``source``'s message of ``what`` fits rank ``dest``'s receive
    ``slot``: the same dtype and number of elements."""
    into = slot.into
    if payload.dtype != into.dtype or payload.numel() != into.numel():
        raise RankMismatchError(
            f"in-process world: rank {source}'s {what} sent {payload.numel()} x {payload.dtype} where rank {dest}'s "
            f"{slot.work._what} receives {into.numel()} x {into.dtype}: the ranks' calls are out of step or their "
            f"arguments differ")


class Slot:
    """One posted receive: the tensor a message is copied into, whether it has been, and the work it counts down."""

    def __init__(self, into: torch.Tensor, work: "MailWork") -> None:
        self.into = into
        self.work = work
        self.filled = False

    def fill(self, payload: torch.Tensor) -> None:
        self.into.copy_(payload)
        self.filled = True
        self.work.missing -= 1


class Reduction:
    """One allreduce of an in-process world: each rank's copy, how many have yet to come, their sum once all have,
    and how many ranks have yet to read it."""

    def __init__(self, size: int) -> None:
        self.parts: list[torch.Tensor | None] = [None] * size
        self.missing = size
        self.total: torch.Tensor | None = None
        self.readers = size


class LocalComm(Communicator):
    """One rank of an in-process world (``local_world``); use it from one thread per rank.

    Each collective sends a copy of this rank's blocks to its peers' mailboxes at once and
    completes when the blocks meant for it have arrived: alltoall, allgather and bcast move
    exactly the bytes MPI and Gloo move, so every compcoll call gives their bits; allreduce
    sums the ranks' tensors in rank order (once, by the last rank to arrive, for all). Byte
    counts, ``wait_seconds``, ``split`` and timeouts (a rank that never arrives raises
    ``CollectiveTimeout`` on the others, naming it) work as on the real transports. Two things fail
    sooner than there: calls out of step, and a rank that failed once its world is ended (``abort``).
    """

    def __init__(self, fabric: Fabric, rank: int, timeout: float | None = None) -> None:
        super().__init__(rank, fabric.size, timeout)
        self.fabric = fabric
        self._splits = 0
        self._reductions = 0

    def describe(self) -> str:
        return "in-process world"

    def _start_alltoall(self, send: torch.Tensor, recv: torch.Tensor) -> Work:
        blocks, rows = send.view(self.size, -1), recv.view(self.size, -1)
        work = MailWork(self, "alltoall", recv, {peer: rows[peer] for peer in self._peers})
        self.fabric.post(self.rank, {peer: blocks[peer] for peer in self._peers}, "alltoall")
        rows[self.rank].copy_(blocks[self.rank])
        return work

    def _start_allgather(self, send: torch.Tensor, recv: torch.Tensor) -> Work:
        rows = recv.view(self.size, -1)
        work = MailWork(self, "allgather", recv, {peer: rows[peer] for peer in self._peers})
        self.fabric.post(self.rank, dict.fromkeys(self._peers, send), "allgather")
        rows[self.rank].copy_(send)
        return work

    def _start_allreduce(self, tensor: torch.Tensor) -> Work:
        call, self._reductions = self._reductions, self._reductions + 1
        return ReduceWork(self, call, tensor)

    def _start_bcast(self, tensor: torch.Tensor, root: int) -> Work:
        if self.rank == root:
            self.fabric.post(self.rank, dict.fromkeys(self._peers, tensor), "bcast")
            return MailWork(self, "bcast", tensor, {})
        return MailWork(self, "bcast", tensor, {root: tensor})

    def _start_barrier(self) -> Work:
        tokens = {peer: torch.zeros(0) for peer in self._peers}
        work = MailWork(self, "barrier", None, tokens)
        self.fabric.post(self.rank, dict.fromkeys(self._peers, torch.zeros(0)), "barrier")
        return work

    def abort(self, reason: str) -> None:
        """End this rank's whole in-process world, as MPI_Abort ends an MPI job: on every rank, each collective that
        waits, now or later, on the world or a communicator split from it, raises ``CommunicatorBroken`` naming
        ``reason`` instead of waiting out its timeout. ``launcher.run_threads`` calls it when a rank fails."""
        self.fabric.root.end(reason)

    def _split(self, color: int, groups: dict[int, list[int]]) -> "LocalComm":
        """Every member of a color gets the same child fabric, keyed by this world's split count and the color."""
        self._splits += 1
        members = groups[color]
        fabric = self.fabric.child((self._splits, color), len(members))
        return LocalComm(fabric, members.index(self.rank), self.timeout)


class FabricWork(PendingWork):
    """A collective of an in-process world: it waits on its rank's condition until ``_arrived``."""

    def __init__(self, comm: LocalComm, what: str, result, finish=None) -> None:
        super().__init__(comm, what, result, finish)
        self._fabric = comm.fabric
        self._arrival = comm.fabric.arrived[comm.rank]

    @abstractmethod
    def _arrived(self) -> bool:
        """Whether the collective's data is all here (called holding the fabric's lock)."""

    def _settled(self) -> bool:
        """Whether the data is all here (called holding the fabric's lock); raises ``CommunicatorBroken`` once the
        world has ended without it (``Fabric.end``)."""
        if self._arrived():
            return True
        if self._fabric.ended is not None:
            raise CommunicatorBroken(f"{self._comm.describe()} {self._what} on rank {self._comm.rank} of "
                                     f"{self._comm.size}: the world ended while it waited ({self._fabric.ended})")
        return False

    def _test(self) -> bool:
        with self._fabric.lock:
            return self._settled()

    def _block(self, seconds: float) -> bool:
        with self._arrival:
            return self._arrival.wait_for(self._settled, timeout=seconds)


class MailWork(FabricWork):
    """A collective's receives, posted when it starts: done when a block from every source has been copied in."""

    def __init__(self, comm: LocalComm, what: str, result, into: dict[int, torch.Tensor]) -> None:
        super().__init__(comm, what, result)
        self.missing = len(into)
        self._slots = {source: Slot(block, self) for source, block in into.items()}
        comm.fabric.expect(comm.rank, self._slots)

    def _arrived(self) -> bool:
        return self.missing == 0

    def _absent(self) -> list[int] | None:
        with self._fabric.lock:
            return sorted(source for source, slot in self._slots.items() if not slot.filled)


class ReduceWork(FabricWork):
    """An allreduce: this rank's copy added when it starts; done when the world's sum is there, copied in by
    ``wait``."""

    def __init__(self, comm: LocalComm, call: int, tensor: torch.Tensor) -> None:
        fabric = comm.fabric
        super().__init__(comm, "allreduce", tensor, lambda: tensor.copy_(fabric.collect(call, self._reduction)))
        self._reduction = fabric.reduce(call, comm.rank, tensor)

    def _arrived(self) -> bool:
        return self._reduction.total is not None

    def _absent(self) -> list[int] | None:
        with self._fabric.lock:
            return [rank for rank, part in enumerate(self._reduction.parts) if part is None]


def local_world(size: int, timeout: float | None = None) -> list[LocalComm]:
    """``size`` communicators of one in-process world, rank r's at index r; give each to its own thread."""
    if isinstance(size, bool) or not isinstance(size, int) or size < 1:
        raise ValueError(f"local_world needs a positive number of ranks, got {size!r}")
    fabric = Fabric(size)
    return [LocalComm(fabric, rank, timeout) for rank in range(size)]
