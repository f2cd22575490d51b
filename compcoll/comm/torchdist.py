"""TorchComm: collectives over any torch.distributed ProcessGroup (Gloo on CPU, NCCL on GPU)."""

from __future__ import annotations

import time
from datetime import timedelta

import torch
import torch.distributed as dist

from ..errors import CollectiveTimeout, CompcollError
from .base import Communicator


class TorchComm(Communicator):
    """A Communicator over a torch.distributed ProcessGroup.

    Collectives are issued with ``async_op=True`` and waited on with ``timeout`` seconds,
    using ``all_to_all_single`` and ``all_gather_single`` (``all_gather_into_tensor`` before
    torch 2.13), the flat-tensor forms NCCL is fastest at; over Gloo the all-to-all (and a
    2-rank all-gather) is point-to-point pairs with the receives posted first
    (``_pairwise``). CUDA tensors go to NCCL as they are (NCCL orders its work after
    torch's current stream); a tensor on the other kind of device than the backend moves
    (NCCL: the small CPU metadata of an agreement; Gloo: CUDA tensors) is copied to the
    backend's device and back.

    Args:
        group: a ProcessGroup; None means the default (WORLD) group, which must be initialised.
        timeout: seconds a collective may take; None reads ``COMPCOLL_TIMEOUT`` (300).
    """

    def __init__(self, group=None, timeout: float | None = None) -> None:
        if not dist.is_available() or not dist.is_initialized():
            raise RuntimeError(
                "TorchComm needs torch.distributed initialised: call "
                "torch.distributed.init_process_group(...) first, or use compcoll.init()"
            )
        self.group = dist.group.WORLD if group is None else group
        self.backend = dist.get_backend(self.group)
        self.device = torch.device("cuda", torch.cuda.current_device()) if self.backend == "nccl" else torch.device("cpu")
        super().__init__(dist.get_rank(self.group), dist.get_world_size(self.group), timeout)
        self.global_ranks = [dist.get_global_rank(self.group, r) for r in range(self.size)]

    def _run(self, what: str, op, send: torch.Tensor | None, recv: torch.Tensor) -> None:
        """Issue ``op(send, recv)`` on tensors of the backend's device, copying others there and back."""
        if recv.device.type == self.device.type and (send is None or send.device.type == self.device.type):
            self._wait(op(send, recv), what)
            return
        moved_send = None if send is None else send.to(self.device)
        moved_recv = recv.to(self.device) if send is None else torch.empty_like(recv, device=self.device)
        self._wait(op(moved_send, moved_recv), what)
        recv.copy_(moved_recv)

    def _wait(self, work, what: str) -> None:
        try:
            work.wait(timeout=timedelta(seconds=self.timeout))
        except RuntimeError as exc:
            if "timed out" not in str(exc).lower():
                raise CompcollError(
                    f"torch.distributed ({self.backend}) {what} failed on rank {self.rank}: {exc}"
                ) from exc
            raise CollectiveTimeout(
                f"torch.distributed ({self.backend}) {what} on rank {self.rank} of {self.size} did "
                f"not complete within {self.timeout:g} s (COMPCOLL_TIMEOUT): did every rank call "
                f"it with matching arguments, or did a rank fail before reaching it?"
            ) from exc

    def _alltoall(self, send: torch.Tensor, recv: torch.Tensor) -> None:
        if self.backend == "gloo":
            self._run("alltoall", lambda s, r: self._pairwise(s.view(self.size, -1), r), send, recv)
        else:
            self._run("alltoall", lambda s, r: dist.all_to_all_single(r, s, group=self.group, async_op=True), send, recv)

    def _allgather(self, send: torch.Tensor, recv: torch.Tensor) -> None:
        if self.backend == "gloo" and self.size == 2:
            self._run("allgather", lambda s, r: self._pairwise(s.view(1, -1).expand(2, -1), r), send, recv)
        else:
            self._run("allgather", lambda s, r: _all_gather_single(r, s, group=self.group, async_op=True), send, recv)

    def _pairwise(self, blocks: torch.Tensor, recv: torch.Tensor) -> "_Works":
        """Block p of ``blocks`` to rank p, block p of ``recv`` from rank p, as point-to-point
        pairs over Gloo with every receive posted before any send.

        1. Copy this rank's own block.
        2. Post an irecv from every peer, then an isend to every peer.
        Gloo's own all-to-all posts each send before the matching receive; on 2 nodes x 1
        rank at 1 Gbit/s, 1 MiB each way, it took 16.7 ms in half the calls (the two
        directions one after the other) against 8.7 ms here in nearly all (the wire's
        time); on 2 x 2 ranks both took 17 ms. Gloo's all-gather does the same with 2
        ranks (15 ms inside a compressed_allreduce, against 8.6 ms over MPI), so a
        2-rank all-gather is this exchange too; with more ranks its ring sends fewer
        bytes between nodes than pairs would, and is kept.
        """
        me = self.rank
        out = recv.view(self.size, -1)
        out[me].copy_(blocks[me])
        peers = [p for p in range(self.size) if p != me]
        works = [dist.irecv(out[p], src=self.global_ranks[p], group=self.group) for p in peers]
        works += [dist.isend(blocks[p], dst=self.global_ranks[p], group=self.group) for p in peers]
        return _Works(works)

    def _allreduce(self, tensor: torch.Tensor) -> None:
        self._run("allreduce", lambda _, t: dist.all_reduce(t, group=self.group, async_op=True), None, tensor)

    def _bcast(self, tensor: torch.Tensor, root: int) -> None:
        source = self.global_ranks[root]
        self._run("bcast", lambda _, t: dist.broadcast(t, src=source, group=self.group, async_op=True), None, tensor)

    def _barrier(self) -> None:
        self._wait(dist.barrier(group=self.group, async_op=True), "barrier")

    def _split(self, color: int, groups: dict[int, list[int]]) -> "TorchComm":
        """Every rank builds every color's group (torch requires all ranks in new_group).

        torch.distributed orders a group's ranks by global rank, so a ``key`` that would
        order them otherwise is refused.
        """
        mine = None
        for c, members in groups.items():
            if members != sorted(members):
                raise ValueError("TorchComm.split keeps rank order; a key that reorders ranks is not supported")
            ranks = [self.global_ranks[r] for r in members]
            group = dist.new_group(ranks=ranks)
            if c == color:
                mine = group
        return TorchComm(mine, self.timeout)


class _Works:
    """Several torch.distributed works waited on as one, within one timeout."""

    def __init__(self, works: list) -> None:
        self.works = works

    def wait(self, timeout: timedelta) -> None:
        deadline = time.monotonic() + timeout.total_seconds()
        for work in self.works:
            work.wait(timeout=timedelta(seconds=max(0.001, deadline - time.monotonic())))


def _all_gather_single(recv, send, **kwargs):
    """torch >= 2.13 names it all_gather_single; older releases all_gather_into_tensor."""
    gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    return gather(recv, send, **kwargs)
