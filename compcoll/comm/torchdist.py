"""TorchComm: collectives over any torch.distributed ProcessGroup (Gloo on CPU, NCCL on GPU)."""

from __future__ import annotations

from datetime import timedelta

import torch
import torch.distributed as dist

from ..errors import CollectiveTimeout, CompcollError
from .base import Communicator


class TorchComm(Communicator):
    """A Communicator over a torch.distributed ProcessGroup.

    Collectives are issued with ``async_op=True`` and waited on with ``timeout`` seconds,
    using ``all_to_all_single`` and ``all_gather_single`` (``all_gather_into_tensor`` before
    torch 2.13), the flat-tensor forms NCCL is fastest at.

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
        super().__init__(dist.get_rank(self.group), dist.get_world_size(self.group), timeout)

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
        self._wait(dist.all_to_all_single(recv, send, group=self.group, async_op=True), "alltoall")

    def _allgather(self, send: torch.Tensor, recv: torch.Tensor) -> None:
        self._wait(_all_gather_single(recv, send, group=self.group, async_op=True), "allgather")

    def _allreduce(self, tensor: torch.Tensor) -> None:
        self._wait(dist.all_reduce(tensor, group=self.group, async_op=True), "allreduce")

    def _bcast(self, tensor: torch.Tensor, root: int) -> None:
        source = dist.get_global_rank(self.group, root)
        self._wait(dist.broadcast(tensor, src=source, group=self.group, async_op=True), "bcast")

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
            ranks = [dist.get_global_rank(self.group, r) for r in members]
            group = dist.new_group(ranks=ranks)
            if c == color:
                mine = group
        return TorchComm(mine, self.timeout)


def _all_gather_single(recv, send, **kwargs):
    """torch >= 2.13 names it all_gather_single; older releases all_gather_into_tensor."""
    gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    return gather(recv, send, **kwargs)
