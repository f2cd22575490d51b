"""TorchComm on a group of one rank that compcoll splits off: its collectives skip the backend.

Multi-rank groups: test_collectives, test_groups.
"""

from __future__ import annotations

from typing import Iterator

import pytest
import torch
import torch.distributed as dist

import compcoll
from compcoll.comm.work import DoneWork


@pytest.fixture
def one_rank_group() -> Iterator[compcoll.TorchComm]:
    """A one-rank Gloo group in this process, destroyed after the test."""
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield compcoll.TorchComm()
    finally:
        dist.destroy_process_group()


def test_a_group_of_one_split_off_copies_without_the_backend(one_rank_group: compcoll.TorchComm,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """A group of one that compcoll splits off (a hierarchical form's node of one rank) is ``alone``: every
    collective completes when started with the copy or nothing a rank sends itself, none of torch.distributed's
    collectives or point-to-point calls made (each raises here); a ``compressed_allreduce`` over it gives
    ``SingleComm``'s bits, its rounds on host numbers and on the device. The group of one the caller gave keeps
    the backend's collectives (a one-rank NCCL group is how one GPU runs NCCL's path)."""
    given = one_rank_group
    work = given.allreduce(torch.zeros(3), async_op=True)
    assert not given.alone and not isinstance(work, DoneWork)
    work.wait()
    comm = given.split(0)
    assert comm.alone and comm.size == 1
    for name in ("all_to_all_single", "all_gather_into_tensor", "all_reduce", "broadcast", "barrier", "isend",
                 "irecv"):
        monkeypatch.setattr(dist, name, lambda *args, _name=name, **kwargs: pytest.fail(f"dist.{_name} called"))
    send = torch.randn(1003, generator=torch.Generator().manual_seed(5))
    for collective in (comm.alltoall, comm.allgather):
        recv = torch.zeros_like(send)
        work = collective(send, recv, async_op=True)
        assert isinstance(work, DoneWork) and torch.equal(recv, send)
    kept = send.clone()
    assert isinstance(comm.allreduce(send, async_op=True), DoneWork) and torch.equal(send, kept)
    assert isinstance(comm.bcast(send, 0, async_op=True), DoneWork) and torch.equal(send, kept)
    assert isinstance(comm.barrier(async_op=True), DoneWork)
    full = compcoll.padded_numel(send.numel(), 1)
    want = compcoll.compressed_allreduce(send, torch.zeros(full), torch.zeros(full), compcoll.SingleComm())
    for on_device in (False, True):
        comm.agrees_on_device = on_device
        got = compcoll.compressed_allreduce(send, torch.zeros(full), torch.zeros(full), comm)
        assert torch.equal(got, want), on_device
