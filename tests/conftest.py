"""Shared fixtures: compile the Numba kernels once before any rank process starts."""

from __future__ import annotations

import pytest
import torch

import compcoll


@pytest.fixture(scope="session", autouse=True)
def compiled_kernels() -> None:
    """Run every kernel specialisation once so rank processes load them from Numba's cache."""
    comm = compcoll.SingleComm()
    for dtype in (torch.float32, torch.float16, torch.bfloat16):
        for protocol in ("gather_scatter", "allgather"):
            compcoll.compressed_allreduce(
                torch.ones(9, dtype=dtype), torch.zeros(16), torch.zeros(16), comm, protocol=protocol
            )
