"""TorchComm: collectives over any torch.distributed ProcessGroup (Gloo on CPU, NCCL on GPU)."""

from __future__ import annotations

import importlib
import time
import weakref
from datetime import timedelta
from typing import Any, Callable

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh

from ..errors import CompcollError
from .base import BROKEN, PAIRWISE_BYTES, Communicator, _nbytes, pairs_small
from .groups import destroyer, new_group, owned
from .single import copied
from .work import DoneWork, PendingWork, Work


def _import_functional_first() -> None:
    """Import ``torch.distributed.nn.functional`` before any group exists, where compcoll is imported first.

    Its functions take ``group=group.WORLD`` as a default argument, bound when the module is
    first imported; torch imports it with ``torch._dynamo`` (a program's first optimizer
    does), so a program that builds an optimizer after ``init_process_group`` holds the
    default group for good: ``destroy_process_group`` then leaves its Gloo threads running
    into the interpreter's exit, where a worker freeing a finished collective's tensors
    aborts the process ("terminate called without an active exception";
    docs/guides/troubleshooting.md). Imported now (2 ms), the defaults are None.
    """
    if dist.is_available() and not dist.is_initialized():
        importlib.import_module("torch.distributed.nn.functional")


_import_functional_first()


class TorchComm(Communicator):
    """A Communicator over a torch.distributed ProcessGroup.

    Collectives are issued with ``async_op=True`` and returned as a ``TorchWork``, waited
    on within ``timeout`` seconds (NCCL's in stream order, bounded by the group's own
    timeout; ``TorchWork._block``); NCCL's blocking ones with ``async_op=False``, on the
    current stream (``in_stream_order``); using ``all_to_all_single`` and ``all_gather_single``
    (``all_gather_into_tensor`` before torch 2.13), the flat-tensor forms NCCL is fastest
    at; over Gloo the all-to-all (and a 2-rank all-gather) is point-to-point pairs, the
    receives posted first for large blocks and the sends for small ones (``_pairwise``).
    CUDA tensors go to NCCL as they are (NCCL orders its work after torch's current
    stream); a tensor on the other kind of device than the backend moves (NCCL: the small
    CPU metadata of an agreement; Gloo: CUDA tensors) is copied to the backend's device
    and back.

    The group is held weakly (``group``): torch.distributed holds every group until
    ``destroy_process_group``, and a communicator that held it too would keep a destroyed
    Gloo group's threads running into the interpreter's exit, where a worker freeing a
    finished collective's tensors aborts the process (docs/guides/troubleshooting.md).

    Args:
        group: a ProcessGroup; None means the default (WORLD) group, which must be initialised.
        timeout: seconds a collective may take; None reads ``COMPCOLL_TIMEOUT`` (300).
    """

    in_stream_order = False
    """Whether a blocking collective on the backend's device is issued in stream order (``_start``): NCCL's, with
    ``async_op=False``, which torch.distributed (2.8 and later, pytorch/pytorch#150398) runs on the current stream,
    where an asynchronous one records an event on NCCL's own stream for the current one to wait for and holds its
    tensors until it completes (half of a collective's host time, 70 -> 35 us, in pytorch/pytorch#147820). A group
    of host tensors may set it (the tests do on Gloo: its blocking collectives then wait inside torch.distributed,
    bounded by the group's own timeout)."""

    def __init__(self, group: dist.ProcessGroup | None = None, timeout: float | None = None) -> None:
        if not dist.is_available() or not dist.is_initialized():
            raise RuntimeError(
                "TorchComm needs torch.distributed initialised: call "
                "torch.distributed.init_process_group(...) first, or use compcoll.init()"
            )
        group = dist.group.WORLD if group is None else group
        self._group = weakref.ref(group)
        self.backend = dist.get_backend(group)
        nccl = self.backend == "nccl"
        self.device = torch.device("cuda", torch.cuda.current_device()) if nccl else torch.device("cpu")
        self.agrees_on_device = nccl
        self.in_stream_order = nccl
        super().__init__(dist.get_rank(group), dist.get_world_size(group), timeout)
        self.global_ranks = [dist.get_global_rank(group, r) for r in range(self.size)]
        self.job_rank, self.job_size = dist.get_rank(), dist.get_world_size()
        self.polled = False  # set once this group's works refuse a finite timeout: waits poll them then
        self.alone = False  # a group of one split off by compcoll (``_split``): its collectives skip the backend

    @property
    def group(self) -> dist.ProcessGroup:
        """The process group, while torch.distributed holds it.

        Raises:
            CompcollError: the group was destroyed (``torch.distributed.destroy_process_group``,
                ``compcoll.shutdown``), naming that; every member that destroyed it raises at the
                same call. Before 2026-12-04 the communicator kept the group alive and went on using it.
        """
        group = self._group()
        if group is None:
            raise CompcollError("TorchComm: its process group was destroyed (torch.distributed.destroy_process_group "
                                "or compcoll.shutdown); make a new TorchComm over a live group")
        return group

    def describe(self) -> str:
        return f"torch.distributed ({self.backend})"

    def _start(self, what: str, op: Callable[..., Any], send: torch.Tensor | None, recv: torch.Tensor,
               blocking: bool, sources: list[int] | None = None) -> Work:
        """Issue ``op(send, recv, async_op)`` on tensors of the backend's device, copying others there (and back on
        completion).

        1. A group of one rank split off by compcoll (``alone``: the hierarchical forms' node of one rank, or their
           one node's inter group) moves nothing over the backend: its exchange is ``recv`` <- ``send``
           (``single.copied``; NCCL's a copy on the current stream, in stream order), an allreduce or a broadcast
           nothing, complete when started, as ``SingleComm``'s. Until 2026-12-06 they were the backend's collectives
           (a whole one-rank call over NCCL took 425-573 us on the H200 where ``SingleComm``'s took 214-227,
           gpu_graphs.txt at f15d93e). A group of one the caller gives keeps the backend's collectives: a one-rank
           NCCL group is how one GPU runs NCCL's path.
        2. A ``blocking`` operation (waited for at once) on a group whose collectives are ordered on the current
           stream (``in_stream_order``: NCCL's) on the backend's device: ``op`` with ``async_op=False``, which
           torch.distributed issues on the current stream, complete in stream order when it returns (torch 2.8
           and later; no event recorded on the backend's stream and waited for, no tensors held for it); ``op``
           answers None and the Work is done. An ``op`` that answers works (Gloo's point-to-point pairs) is held
           as any.
        3. Otherwise ``op`` with ``async_op=True``, its works held in a ``TorchWork``; ``sources`` are the ranks the
           first works of a ``_pairwise`` exchange receive from.
        """
        if self.alone:
            return DoneWork(recv if send is None else copied(send, recv))
        if recv.device.type == self.device.type and (send is None or send.device.type == self.device.type):
            works = op(send, recv, not (blocking and self.in_stream_order))
            if works is None:
                return DoneWork(recv)
            return TorchWork(self, what, _list(works), recv, sources=sources)
        moved_send = None if send is None else _moved(send, self.device)
        moved_recv = _moved(recv, self.device) if send is None else torch.empty_like(recv, device=self.device)
        return TorchWork(self, what, _list(op(moved_send, moved_recv, True)), recv, lambda: recv.copy_(moved_recv),
                         sources)

    def _start_alltoall(self, send: torch.Tensor, recv: torch.Tensor, blocking: bool) -> Work:
        if self.backend == "gloo":
            return self._start("alltoall", lambda s, r, _: self._pairwise(s.view(self.size, -1), r), send, recv,
                               blocking, self._peers)
        return self._start("alltoall", lambda s, r, a: dist.all_to_all_single(r, s, group=self.group, async_op=a),
                           send, recv, blocking)

    def _start_allgather(self, send: torch.Tensor, recv: torch.Tensor, blocking: bool) -> Work:
        if self.backend == "gloo" and (self.size == 2 or pairs_small(self.size, _nbytes(send))):
            return self._start("allgather", lambda s, r, _: self._pairwise(s.view(1, -1).expand(self.size, -1), r),
                               send, recv, blocking, self._peers)
        return self._start("allgather", lambda s, r, a: _all_gather_single(r, s, group=self.group, async_op=a),
                           send, recv, blocking)

    def _pairwise(self, blocks: torch.Tensor, recv: torch.Tensor) -> list:
        """Block p of ``blocks`` to rank p, block p of ``recv`` from rank p, as point-to-point
        pairs over Gloo: the receives' works, then the sends'.

        1. Copy this rank's own block.
        2. Blocks of more than ``PAIRWISE_BYTES``: post an irecv from every peer, then an
           isend to every peer. Gloo's own all-to-all posts each send before the matching
           receive; on 2 nodes x 1 rank at 1 Gbit/s, 1 MiB each way, it took 16.7 ms in half
           the calls (the two directions one after the other) against 8.7 ms here in nearly
           all (the wire's time); on 2 x 2 ranks both took 17 ms.
        3. Smaller blocks (every call's agreement round, a small call's chunks): the isends
           first, then the irecvs. A compressed_allreduce of 1000 floats on 2 Gloo ranks (12
           alternations of 300 calls, medians) took 2.99 ms against 3.82 with the receives
           first on one machine, and 3.46 ms against 4.38 on 2 emulated nodes at 1 Gbit/s
           (200 calls each); a 24-byte exchange, 0.167 ms against 0.414.
        4. A post that fails (a peer gone) leaves what was already posted in ``BROKEN``:
           a Gloo receive freed before its data came would leave Gloo's loop spinning.
        Gloo's all-gather sends each block before the receive too with 2 ranks (15 ms inside
        a compressed_allreduce at 1 MiB, against 8.6 ms over MPI), so a 2-rank all-gather is
        this exchange; with more ranks its ring sends fewer bytes between nodes than pairs
        would, and is kept, except for small all-gathers (``pairs_small``: up to 64 ranks): pairs let a
        timeout name the ranks that sent nothing and a closed connection the rank behind
        it, and took 0.8 ms against Gloo's 1.5 ms at 3 local ranks.
        """
        me = self.rank
        out = recv.view(self.size, -1)
        out[me].copy_(blocks[me])
        receives = [(dist.irecv, p, out[p]) for p in self._peers]
        sends = [(dist.isend, p, blocks[p]) for p in self._peers]
        small = _nbytes(blocks[me]) <= PAIRWISE_BYTES
        posted: list = []
        for start, peer, tensor in (sends + receives if small else receives + sends):
            try:
                posted.append(start(tensor, self.global_ranks[peer], group=self.group))
            except RuntimeError as exc:
                BROKEN.extend(posted)  # what was posted still takes its data (``Communicator._track``)
                raise CompcollError(
                    f"{self.describe()} exchange with rank {peer} failed on rank {self.rank} (did rank {peer} die "
                    f"or leave?): {exc}"
                ) from exc
        return posted[len(sends):] + posted[:len(sends)] if small else posted

    def _start_allreduce(self, tensor: torch.Tensor, blocking: bool) -> Work:
        return self._start("allreduce", lambda _, t, a: dist.all_reduce(t, group=self.group, async_op=a), None,
                           tensor, blocking)

    def _start_bcast(self, tensor: torch.Tensor, root: int, blocking: bool) -> Work:
        source = self.global_ranks[root]
        return self._start("bcast", lambda _, t, a: dist.broadcast(t, src=source, group=self.group, async_op=a),
                           None, tensor, blocking)

    def _start_barrier(self) -> Work:
        if self.alone:
            return DoneWork()
        return TorchWork(self, "barrier", [dist.barrier(group=self.group, async_op=True)], None)

    def _split(self, color: int, groups: dict[int, list[int]]) -> "TorchComm":
        """This rank's color's group of torch.distributed.

        1. On a group of every rank, every rank builds every color's group (``new_group`` is
           a collective of the default group).
        2. On a subgroup (a data-parallel group of a 2-D job), whose peers outside it do not
           take part, each rank builds its own color's group with that color's ranks alone
           (``use_local_synchronization``: the colors are disjoint, and built in the same
           order on every member). Before 2026-11-30 the subgroup's ranks called the default
           group's collective without the others, and waited forever.
        torch.distributed orders a group's ranks by global rank, so a ``key`` that would
        order them otherwise is refused. Over Gloo the group ends with the returned
        communicator (``groups.owned``). A group of one rank is still made (every rank makes
        every group alike), and its communicator is ``alone``: its collectives skip the backend.
        """
        local = self.size != dist.get_world_size()
        mine = None
        for c, members in groups.items():
            if members != sorted(members):
                raise ValueError("TorchComm.split keeps rank order; a key that reorders ranks is not supported")
            if local and c != color:
                continue
            group = new_group([self.global_ranks[r] for r in members], local=local)
            if c == color:
                mine = group
        child = TorchComm(mine, self.timeout)
        child.alone = len(groups[color]) == 1
        return _owned(child)


_DROPPED = ("closed by peer", "reset by peer", "Broken pipe")
"""How Gloo's errors say a peer's connection went: it closed it (it left), or it died (a reset, or a broken pipe
where this rank wrote first)."""


class TorchWork(PendingWork):
    """torch.distributed works (one collective, or the point-to-point pairs of one) in flight, as one.

    ``sources[i]``, where given, is the rank the i-th work receives from: a timeout then
    names the ranks whose receives had not completed, and a failed receive (Gloo: the
    peer closed its connection) the rank behind it.
    """

    def __init__(self, comm: TorchComm, what: str, works: list, result: Any, finish: Callable[[], None] | None = None,
                 sources: list[int] | None = None) -> None:
        super().__init__(comm, what, result, finish)
        self._works = works
        self._sources = sources
        self._late: list[int] | None = None

    def _test(self) -> bool:
        return all(work.is_completed() for work in self._works)

    def _absent(self) -> list[int] | None:
        return self._late

    def _block(self, seconds: float) -> bool:
        """Wait for every work: NCCL's in stream order, the others on the host within ``seconds``.

        1. NCCL: ``work.wait()`` with no timeout makes the current CUDA stream wait for
           the collective and returns at once; with a timeout it would hold this thread
           polling until the GPU finishes. A hung NCCL collective is ended by the process
           group's watchdog after the group's own timeout (``compcoll.init`` sets it to
           the communicator's), which aborts the job on every rank.
        2. Otherwise wait on each work in turn until the deadline; a timeout names the
           ranks whose receives had not completed, a failure the peer behind it (a Gloo
           collective's closed, reset or broken connection says only that some peer dropped it).
        """
        if self._comm.backend == "nccl":
            for work in self._works:
                work.wait()
            return True
        deadline = time.monotonic() + seconds
        for index, work in enumerate(self._works):
            try:
                if self._comm.polled:
                    _poll(work, deadline)
                else:
                    work.wait(timeout=timedelta(seconds=max(0.001, deadline - time.monotonic())))
            except RuntimeError as exc:
                if "finite timeout not implemented" in str(exc) and not self._comm.polled:
                    self._comm.polled = True  # torch's multi-threaded test group: poll instead, same deadline
                    return self._block(max(0.0, deadline - time.monotonic()))
                if "timed out" in str(exc).lower():
                    if self._sources is not None:
                        self._late = [rank for i, rank in enumerate(self._sources)
                                      if i == index or (i > index and not self._works[i].is_completed())]
                    return False
                peer = ""
                if self._sources is not None and index < len(self._sources):
                    peer = f" (receiving from rank {self._sources[index]}: did it die or leave?)"
                elif any(sign in str(exc) for sign in _DROPPED):
                    peer = (" (a peer dropped its connection; a Gloo collective does not say which:"
                            " did one die or leave?)")
                raise CompcollError(
                    f"{self._comm.describe()} {self._what} failed on rank {self._comm.rank}{peer}: {exc}"
                ) from exc
        return True


def _poll(work: dist.Work, deadline: float) -> None:
    """Wait for ``work`` by polling ``is_completed`` (for groups whose works take no finite timeout); past
    ``deadline``, RuntimeError("timed out"), as a timed wait raises."""
    pause = 1e-5
    while not work.is_completed():
        if time.monotonic() >= deadline:
            raise RuntimeError("timed out polling the work")
        time.sleep(pause)
        pause = min(2 * pause, 1e-3)
    work.wait()


def _moved(tensor: torch.Tensor, device: torch.device) -> torch.Tensor:
    """``tensor`` copied to ``device`` for a collective there (NCCL's: a host tensor, as every agreement round's).

    A host tensor bound for a CUDA device goes through pinned memory from torch's caching host allocator (which
    keeps the block until the copy has run) and is copied on the current stream with no host wait, ahead of the
    collective, which NCCL queues behind that stream's work; a pageable copy would wait for the stream first. Any
    other move is ``tensor.to(device)``.
    """
    if tensor.is_cpu and device.type == "cuda":
        return tensor.pin_memory().to(device, non_blocking=True)
    return tensor.to(device)


def _list(work: dist.Work | list) -> list:
    return work if isinstance(work, list) else [work]


def _all_gather_single(recv: torch.Tensor, send: torch.Tensor, **kwargs: Any) -> dist.Work | None:
    """torch >= 2.13 names it all_gather_single; older releases all_gather_into_tensor."""
    gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    return gather(recv, send, **kwargs)


def reduce_scatter_single(output: torch.Tensor, input: torch.Tensor, **kwargs: Any) -> dist.Work | None:
    """torch.distributed's flat reduce-scatter: reduce_scatter_single from torch 2.13, reduce_scatter_tensor
    before."""
    scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
    return scatter(output, input, **kwargs)


def process_group_of(given: Any, what: str) -> dist.ProcessGroup | None:
    """A hook or FSDP state's ``process_group`` argument as a process group: a ``ProcessGroup`` or None as given,
    a 1-D ``DeviceMesh`` (what ``DDP(device_mesh=...)`` and ``fully_shard(mesh=...)`` take) as its group.

    Raises:
        TypeError: anything else, naming it (before 2026-12-03 a mesh gave a ``KeyError`` of its repr).
    """
    if given is None or isinstance(given, dist.ProcessGroup):
        return given
    if isinstance(given, DeviceMesh) and given.ndim == 1:
        return given.get_group()
    shape = f" of {given.ndim} dimensions; pass one, mesh['name']," if isinstance(given, DeviceMesh) else ","
    raise TypeError(f"{what}: process_group must be a torch.distributed ProcessGroup{shape} a 1-D DeviceMesh or "
                    f"None (the default group), got {given!r}")


def group_ready(given: dist.ProcessGroup | None) -> bool:
    """Whether a state given the process group ``given`` (``process_group_of``'s) can take it now: one was given, or
    torch.distributed's default group exists. False before ``init_process_group``, where a framework builds the
    state from its configuration (Lightning's ``DDPStrategy(ddp_comm_state=...)``, as for ``PowerSGDState``): the
    state then takes the default group at its first use (``require_group`` where there is still none)."""
    return given is not None or dist.is_initialized()


def require_group(given: dist.ProcessGroup | None, what: str) -> None:
    """Raise where a state built before ``init_process_group`` is first used while there is still no default group.

    Raises:
        ValueError: naming ``what`` and the order that works.
    """
    if not group_ready(given):
        raise ValueError(f"{what}: torch.distributed is not initialized; a state built before init_process_group "
                         f"takes the default group at its first use (the hook's first bucket or state_dict), which "
                         f"must come after init_process_group")


def own_comm(process_group: dist.ProcessGroup | None, timeout: float | None) -> TorchComm:
    """A TorchComm on a new group of the same ranks and backend as ``process_group`` (None: the default group).

    compcoll's collectives run on its communicator's ordering thread; on a group of their
    own they cannot interleave with the collectives DDP or FSDP issue (buffer broadcasts,
    the unused-parameter map, parameter all-gathers) in an order that differs between ranks.
    ``new_group`` is a collective of the default group: build the state on every rank at the
    same point.
    1. A group of every rank: one ``new_group`` of them.
    2. A subgroup (HSDP's replicas: each rank passes its own): every rank's members are
       all-gathered over the default group, and every distinct set becomes a group, in the
       same order on every rank; this rank keeps its own.
    The group is the returned communicator's alone: over Gloo it is destroyed once the
    communicator is freed (``groups.owned``).
    """
    group = dist.group.WORLD if process_group is None else process_group
    ranks = dist.get_process_group_ranks(group)
    backend = dist.get_backend(group)
    if len(ranks) == dist.get_world_size():
        return _owned(TorchComm(new_group(ranks, backend), timeout))
    members: list = [None] * dist.get_world_size()
    dist.all_gather_object(members, ranks)
    mine = None
    for each in sorted({tuple(m) for m in members}):
        made = new_group(list(each), backend)
        if dist.get_rank() in each:
            mine = made
    return _owned(TorchComm(mine, timeout))


def _owned(comm: TorchComm) -> TorchComm:
    """``comm``, whose group compcoll made for it alone: over Gloo the group is destroyed once ``comm`` is freed
    (``groups.owned``); NCCL's stay (see there)."""
    return owned(comm, destroyer(comm.group)) if comm.backend == "gloo" else comm
