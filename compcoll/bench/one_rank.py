"""The one-rank communicators the GPU benchmarks time a call over: SingleComm and a one-rank NCCL group."""

from __future__ import annotations

import os

import torch.distributed as dist

import compcoll
from ..comm import Communicator

KINDS = ("single", "single-host", "nccl", "nccl-host", "nccl-async")
"""``one_rank_comm``'s kinds."""


def one_rank_comm(kind: str) -> Communicator:
    """A one-rank communicator of ``kind``.

    1. "single": ``SingleComm`` (its wire is device copies, its agreement rounds on the device); "single-host": one
       with its rounds on host numbers (MPI's and Gloo's path; ``SingleComm``'s until 2026-12-06).
    2. "nccl": a one-rank NCCL group through ``compcoll.init`` (torchrun's variables set where absent), its
       agreement rounds on the device.
    3. "nccl-host": a communicator on the same group with its agreement rounds on host numbers (NCCL's rounds until
       2026-12-01: the sum read first, the record copied up and back; ``Communicator.agrees_on_device`` off).
    4. "nccl-async": a communicator on the same group whose blocking collectives are issued asynchronously, on NCCL's
       own stream, an event recorded there for the current stream to wait for (NCCL's until 2026-12-06;
       ``TorchComm.in_stream_order`` off), its rounds on the device.
    """
    if kind not in KINDS:
        raise ValueError(f"one_rank_comm: kind {kind!r} is not one of {KINDS}")
    if kind.startswith("single"):
        comm = compcoll.SingleComm()
        comm.agrees_on_device = kind == "single"
        return comm
    for name, value in (("RANK", "0"), ("LOCAL_RANK", "0"), ("WORLD_SIZE", "1"), ("MASTER_ADDR", "127.0.0.1"),
                        ("MASTER_PORT", "29533"), ("COMPCOLL_TORCH_BACKEND", "nccl")):
        os.environ.setdefault(name, value)
    comm = compcoll.init("torch") if kind == "nccl" or not dist.is_initialized() else compcoll.TorchComm()
    comm.agrees_on_device = kind != "nccl-host"
    comm.in_stream_order = kind != "nccl-async"
    return comm
