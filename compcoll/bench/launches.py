"""Kernel launches, tensor wraps and host waits of one call of each protocol: on CUDA tensors, or traced on meta."""

from __future__ import annotations

from typing import Callable

import torch

import compcoll
from ..comm import Communicator
from ..kernels.launch import COUNTS

PROTOCOLS = ("gather_scatter", "allgather", "hierarchical", "birder")
"""The calls counted: flat 1-bit gather-scatter and allgather, the compensated hierarchical form, Birder's."""


def protocol_calls(x: torch.Tensor, comm: Communicator) -> dict[str, Callable[[], object]]:
    """One call of each protocol on ``x`` over ``comm`` (one node), with zeroed error buffers on ``x``'s device."""
    full = compcoll.padded_numel(x.numel(), comm.size)
    we, se = torch.zeros(full, device=x.device), torch.zeros(full // comm.size, device=x.device)
    hwn, hsn = compcoll.hierarchical_error_numels(x.numel(), comm.size, comm.size)
    hwe, hse = torch.zeros(hwn, device=x.device), torch.zeros(hsn, device=x.device)
    return {
        "gather_scatter": lambda: compcoll.compressed_allreduce(x, we, se, comm),
        "allgather": lambda: compcoll.compressed_allreduce(x, we, se, comm, protocol="allgather"),
        "hierarchical": lambda: compcoll.hierarchical_compressed_allreduce(x, hwe, hse, comm,
                                                                           ranks_per_node=comm.size),
        "birder": lambda: compcoll.hierarchical_allreduce(x, comm, ranks_per_node=comm.size, seed=1, step=0),
    }


def call_counts(x: torch.Tensor, comm: Communicator, synchronize: Callable[[], None] = lambda: None
                ) -> dict[str, dict[str, int]]:
    """``{protocol: {"launches": N, "wraps": N, "waits": N}}`` of one call of each protocol on ``x``.

    1. Call the protocol once: it agrees its plan, compiles and allocates.
    2. Wait for the device (``synchronize``), reset ``kernels.launch.COUNTS``, call it again
       and wait again.
    3. Read the counts: those of a steady call. On meta tensors nothing runs, and the
       counts are those the same call makes on CUDA tensors.
    """
    found = {}
    for name, call in protocol_calls(x, comm).items():
        call()
        synchronize()
        COUNTS.reset()
        call()
        synchronize()
        found[name] = {"launches": COUNTS.launches, "wraps": COUNTS.wraps, "waits": COUNTS.waits}
    return found
