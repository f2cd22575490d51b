"""Shared fixtures: compile the Numba kernels once before any rank process starts."""

from __future__ import annotations

import pytest
import torch

import compcoll
from compcoll.kernels import cpu


@pytest.fixture(scope="session", autouse=True)
def compiled_kernels() -> None:
    """Run every kernel specialisation once (serial and threaded twins, whole and in pieces)
    so rank processes load them from Numba's cache."""
    comm = compcoll.SingleComm()
    large = cpu.SERIAL_BELOW + 9
    for numel in (9, large):
        full = compcoll.padded_numel(numel, 1)
        for dtype in (torch.float32, torch.float16, torch.bfloat16):
            for protocol, pieces in (("gather_scatter", 1), ("gather_scatter", 2), ("allgather", 1)):
                compcoll.compressed_allreduce(torch.ones(numel, dtype=dtype), torch.zeros(full), torch.zeros(full),
                                              comm, protocol=protocol, pieces=pieces)
            compcoll.hierarchical_allreduce(torch.ones(numel, dtype=dtype), comm, ranks_per_node=1)
