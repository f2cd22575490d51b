"""compcoll.bench.one_rank: the one-rank communicators of the GPU benchmarks."""

from __future__ import annotations

import pytest
import torch

import compcoll
from compcoll.bench.one_rank import one_rank_comm


def test_single_kinds_are_single_comms_that_run_a_call_alike() -> None:
    """"single" agrees on the device (``SingleComm``'s own rounds), "single-host" on host numbers: the same bits."""
    x = torch.randn(1000, generator=torch.Generator().manual_seed(2))
    full = compcoll.padded_numel(1000, 1)
    outs = {}
    for kind, on_device in (("single", True), ("single-host", False)):
        comm = one_rank_comm(kind)
        assert isinstance(comm, compcoll.SingleComm) and comm.size == 1 and comm.agrees_on_device == on_device
        outs[kind] = compcoll.compressed_allreduce(x, torch.zeros(full), torch.zeros(full), comm)
    assert outs["single"].shape == x.shape and bool(torch.isfinite(outs["single"]).all())
    assert torch.equal(outs["single"], outs["single-host"])


def test_an_unknown_kind_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match="'gloo' is not one of"):
        one_rank_comm("gloo")
