"""LocalComm: n ranks of one world in this process, one thread each, moving the same bytes as MPI and Gloo."""

from __future__ import annotations

import threading
from abc import abstractmethod
from typing import Any, Callable

import torch

from ..errors import CommunicatorBroken, RankMismatchError
from .base import Communicator
from .work import PendingWork, Work


class Fabric:
    """The meeting place of one in-process world: for each collective, in the order every rank issues them, a board
    where each rank leaves its part.

    Every rank issues its collectives on a communicator in the same order (as MPI and Gloo
    require), so the k-th collective of each rank meets on board k, whichever comes first.
    The rank that completes a board builds its result once for every rank (the all-gather's
    rows, the all-to-all's blocks, the broadcast's copy, the allreduce's sum in rank order),
    copies each rank's share into that rank's tensors (so they fill whether or not anyone
    waits, as a transport delivers), under one hold of the world's lock, and wakes each
    rank's condition (``arrived[rank]``) once. So a collective costs
    O(n) Python steps across the world, not one per pair of ranks: two flat gather-scatter
    calls of 10,007 elements took 0.6-1.0 s on 256 ranks and 3.2 s on 1,024, where a mailbox
    per pair of ranks took 5.5-9.6 s and 78.7 s (side by side, 2026-11-28; on 2026-12-06, with the
    calls' own agreement and kernels grown since, 1.10-1.14 s and 4.4-4.9 s, the threads' start
    included: ``run_threads`` from its call to its return). No rank's part is copied
    before the board completes: every rank is still in the call then, with its buffers as it
    left them (as MPI asks of a non-blocking call's buffers).

    The ranks must agree on the call (kind, dtype and length of each rank's part, the root):
    calls out of step (one rank's all-to-all meeting another's allgather, say) raise
    ``RankMismatchError`` naming both on every rank of the board, where MPI or Gloo could
    move the bytes or wait. ``end`` ends the world and every sub-world split from it, as
    MPI_Abort ends a job. ``leave`` records a rank that will issue no more collectives (its
    function returned): a board that still waits for it raises ``RankMismatchError`` on the
    ranks there, where MPI or Gloo would wait out the timeout.
    """

    def __init__(self, members: list[int], root: "Fabric | None" = None) -> None:
        self.size = len(members)
        self.members = members
        self.root = root or self
        self.lock = threading.Lock()
        self.arrived = [threading.Condition(self.lock) for _ in range(self.size)]
        self.boards: dict[int, Board] = {}
        self.children: dict[tuple, Fabric] = {}
        self.ended: str | None = None
        self.left: set[int] = set()
        """The world's ranks that left (``leave``): held by the root fabric alone, which every sub-world reads."""

    def join(self, call: int, rank: int, what: str, tensor: torch.Tensor | None, part: torch.Tensor | None,
             build: Callable[[list], object], deliver: Callable[[object], object]) -> "Board":
        """Leave ``rank``'s ``part`` (or None) of its collective number ``call``, a ``what`` on ``tensor`` (its
        own send or in-place tensor, which every rank's must match in dtype and length), on that board; the rank that
        completes the board runs ``build(parts)`` for the result, each rank's ``deliver(result)``, and wakes every
        rank. Raises ``RankMismatchError`` where the board holds another call (and marks the board, so the ranks
        waiting there raise it too)."""
        if part is not None and part.is_cuda:
            torch.cuda.current_stream(part.device).synchronize()
        call_of = (what, None if tensor is None else (tensor.dtype, tensor.numel()))
        with self.lock:
            board = self.boards.setdefault(call, Board(self.size))
            first = board.first = rank if board.first is None else board.first
            board.calls[rank], board.parts[rank], board.deliveries[rank] = call_of, part, deliver
            board.missing -= 1
            if board.missing == 0:
                del self.boards[call]
            if board.calls[first] != call_of and board.error is None:
                board.error = (f"in-process world: rank {rank}'s {_called(call_of)} met rank {first}'s "
                               f"{_called(board.calls[first])} as collective number {call}: the ranks' calls are "
                               "out of step or their arguments differ")
                for arrived in self.arrived:
                    arrived.notify_all()
            if board.error is not None:
                raise RankMismatchError(board.error)
            if board.missing == 0:
                result = build(board.parts)
                for delivery in board.deliveries:
                    delivery(result)
                if isinstance(result, torch.Tensor) and result.is_cuda:
                    torch.cuda.current_stream(result.device).synchronize()
                board.parts = board.deliveries = []
                for arrived in self.arrived:
                    arrived.notify_all()
        return board

    def end(self, reason: str) -> None:
        """End this world and its sub-worlds: each collective waiting in one, or started later, raises
        ``CommunicatorBroken`` naming ``reason`` (the first reason given stays)."""
        def mark(fabric: Fabric) -> None:
            if fabric.ended is None:
                fabric.ended = reason

        self._wake(mark)

    def leave(self, rank: int) -> None:
        """Record that rank ``rank`` of the whole world (``members`` numbers a sub-world's ranks so) issues no more
        collectives, and wake every rank of this world and its sub-worlds to look again at what it waits for."""
        with self.root.lock:
            self.root.left.add(rank)
        self.root._wake(lambda fabric: None)

    def _wake(self, change: Callable[["Fabric"], None]) -> None:
        """Apply ``change`` to this fabric and each sub-world's, each under its own lock, waking its ranks there."""
        with self.lock:
            change(self)
            for arrived in self.arrived:
                arrived.notify_all()
            children = list(self.children.values())
        for child in children:
            child._wake(change)

    def absent(self, board: "Board") -> list[int]:
        """The ranks (of this fabric) that have not joined ``board`` and never will: their function returned."""
        left = self.root.left
        return [rank for rank, call in enumerate(board.calls) if call is None and self.members[rank] in left]

    def child(self, key: tuple, members: list[int]) -> "Fabric":
        """The fabric of a sub-world of these ``members`` (this fabric's ranks), the same object for every member
        that asks with ``key``."""
        with self.lock:
            found = self.children.get(key)
            if found is None:
                found = self.children[key] = Fabric([self.members[m] for m in members], self.root)
                found.ended = self.ended
            return found


def _called(call_of: tuple) -> str:
    """A rank's call on a board, for messages: "allgather of 3 x torch.float64"."""
    what, shape = call_of
    return what if shape is None else f"{what} of {shape[1]} x {shape[0]}"


class Board:
    """One collective of an in-process world: each rank's call, part and delivery, the rank that came first, how
    many have yet to come, and the error of calls that differ."""

    def __init__(self, size: int) -> None:
        self.calls: list[tuple | None] = [None] * size
        self.parts: list[torch.Tensor | None] = [None] * size
        self.deliveries: list[Callable[[object], object] | None] = [None] * size
        self.first: int | None = None
        self.missing = size
        self.error: str | None = None


class LocalComm(Communicator):
    """One rank of an in-process world (``local_world``); use it from one thread per rank.

    Each collective leaves this rank's part on the world's board for it (``Fabric.join``) and
    completes when every rank has: alltoall, allgather and bcast move exactly the bytes MPI
    and Gloo move, so every compcoll call gives their bits; allreduce sums the ranks' tensors
    in rank order (once, by the last rank to arrive, for all). Byte
    counts, ``wait_seconds``, ``split`` and timeouts (a rank that never arrives raises
    ``CollectiveTimeout`` on the others, naming it) work as on the real transports. Three things fail
    sooner than there: calls out of step, a rank that failed once its world is ended (``abort``), and a call
    that waits for a rank that returned (``leave``).
    Its collectives take meta tensors too (``carries_meta``), so a world of meta tensors counts the CUDA path's
    launches at any number of ranks.
    """

    carries_meta = True

    def __init__(self, fabric: Fabric, rank: int, timeout: float | None = None) -> None:
        super().__init__(rank, fabric.size, timeout)
        self.fabric = fabric
        self._splits = 0
        self._calls = 0

    def describe(self) -> str:
        return "in-process world"

    def _start_alltoall(self, send: torch.Tensor, recv: torch.Tensor, blocking: bool) -> Work:
        n, rank = self.size, self.rank
        return self._meet("alltoall", send, send, lambda parts: torch.stack([p.view(n, -1) for p in parts]),
                          lambda blocks: recv.view(n, -1).copy_(blocks[:, rank]), recv)

    def _start_allgather(self, send: torch.Tensor, recv: torch.Tensor, blocking: bool) -> Work:
        return self._meet("allgather", send, send, lambda parts: torch.cat([p.reshape(-1) for p in parts]),
                          lambda rows: recv.view(-1).copy_(rows), recv)

    def _start_allreduce(self, tensor: torch.Tensor, blocking: bool) -> Work:
        return self._meet("allreduce", tensor, tensor, _sum_in_rank_order, tensor.copy_, tensor)

    def _start_bcast(self, tensor: torch.Tensor, root: int, blocking: bool) -> Work:
        part = tensor if self.rank == root else None
        copy = (lambda _: None) if self.rank == root else tensor.copy_
        return self._meet(f"bcast from rank {root}", tensor, part, lambda parts: parts[root].clone(), copy, tensor)

    def _start_barrier(self) -> Work:
        return self._meet("barrier", None, None, lambda parts: None, lambda _: None, None)

    def _meet(self, what: str, tensor: torch.Tensor | None, part: torch.Tensor | None,
              build: Callable[[list], object], copy: Callable[[object], object], result: object) -> Work:
        """This rank's collective number k (counted per communicator) on the fabric's board k: ``part`` left there,
        ``build`` and every rank's ``copy`` of the result into its tensors run by the rank that completes it."""
        call, self._calls = self._calls, self._calls + 1
        return BoardWork(self, what.split()[0], self.fabric.join(call, self.rank, what, tensor, part, build, copy),
                         result)

    def abort(self, reason: str) -> None:
        """End this rank's whole in-process world, as MPI_Abort ends an MPI job: on every rank, each collective that
        waits, now or later, on the world or a communicator split from it, raises ``CommunicatorBroken`` naming
        ``reason`` instead of waiting out its timeout. ``launcher.run_threads`` calls it when a rank fails."""
        self.fabric.root.end(reason)

    def leave(self) -> None:
        """Say that this rank issues no more collectives (its function has returned, as a rank calls
        MPI_Finalize): once this rank's calls queued before have run, each collective that waits for it, now or
        later, on the world or a communicator split from it, raises ``RankMismatchError`` on the ranks there,
        naming it, instead of waiting out its timeout. ``launcher.run_threads`` calls it when a rank returns.

        1. Run a call that does nothing in this rank's turn (``Ordering.run``): every collective
           this rank issued, asynchronous ones too, has joined its board then.
        2. Record the rank as left on the world's fabric and wake every waiting rank.
        """
        self._ordering.run(lambda: None, "leave")
        self.fabric.leave(self.fabric.members[self.rank])

    def _split(self, color: int, groups: dict[int, list[int]]) -> "LocalComm":
        """Every member of a color gets the same child fabric, keyed by this world's split count and the color."""
        self._splits += 1
        members = groups[color]
        fabric = self.fabric.child((self._splits, color), members)
        return LocalComm(fabric, members.index(self.rank), self.timeout)


class FabricWork(PendingWork):
    """A collective of an in-process world: it waits on its rank's condition until ``_arrived``."""

    def __init__(self, comm: LocalComm, what: str, result: Any, finish: Callable[[], None] | None = None) -> None:
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


class BoardWork(FabricWork):
    """One rank's collective on a board: done (its share copied in) when every rank has joined."""

    def __init__(self, comm: LocalComm, what: str, board: Board, result: object) -> None:
        super().__init__(comm, what, result)
        self._board = board

    def _arrived(self) -> bool:
        if self._board.error is not None:
            raise RankMismatchError(self._board.error)
        if self._board.missing == 0:
            return True
        gone = self._fabric.absent(self._board)
        if gone:
            raise RankMismatchError(
                f"in-process world: rank(s) {', '.join(map(str, gone))} of {self._comm.size} returned from their "
                f"function without calling the {self._what} that rank {self._comm.rank} waits in: the ranks' calls "
                "are out of step")
        return False

    def _absent(self) -> list[int] | None:
        with self._fabric.lock:
            return [rank for rank, call in enumerate(self._board.calls) if call is None]


def _sum_in_rank_order(parts: list[torch.Tensor]) -> torch.Tensor:
    """The allreduce's sum: rank 0's part, then each other rank's added in rank order."""
    total = parts[0].clone()
    for part in parts[1:]:
        total += part
    return total


def local_world(size: int, timeout: float | None = None) -> list[LocalComm]:
    """``size`` communicators of one in-process world, rank r's at index r; give each to its own thread."""
    if isinstance(size, bool) or not isinstance(size, int) or size < 1:
        raise ValueError(f"local_world needs a positive number of ranks, got {size!r}")
    fabric = Fabric(list(range(size)))
    return [LocalComm(fabric, rank, timeout) for rank in range(size)]
