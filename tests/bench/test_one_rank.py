"""compcoll.bench.one_rank: the one-rank communicators of the GPU benchmarks."""

from __future__ import annotations

import pytest
import torch

import compcoll
from compcoll.bench.one_rank import one_rank_comm


def test_single_is_a_single_comm_that_runs_a_call() -> None:
    comm = one_rank_comm("single")
    assert isinstance(comm, compcoll.SingleComm) and comm.size == 1
    x = torch.randn(1000, generator=torch.Generator().manual_seed(2))
    full = compcoll.padded_numel(1000, 1)
    out = compcoll.compressed_allreduce(x, torch.zeros(full), torch.zeros(full), comm)
    assert out.shape == x.shape and bool(torch.isfinite(out).all())


def test_an_unknown_kind_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match="'gloo' is not one of"):
        one_rank_comm("gloo")
