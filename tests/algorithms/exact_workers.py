"""Rank-side bodies of the exact average's tests (run by compcoll.launcher)."""

from __future__ import annotations

import numpy as np
import torch

import compcoll
from compcoll.algorithms.exact import exact_average
from compcoll.kernels import reference
from compcoll.workspace import Workspace
from tests.algorithms.onebit_workers import assert_same_on_all_ranks, world_inputs


def numerics(comm: compcoll.Communicator, lengths: list[int], steps: int) -> None:
    """``exact_average`` of every length, into a tensor of its own and in place, equals the reference's average of
    the ranks' inputs (summed in rank order, then divided by n) bit for bit on every rank, its workspace kept from
    step to step: lengths that are a multiple of n go out as their own rows and come back straight into ``out``,
    the others through the padded buffers."""
    workspace = Workspace()
    for step in range(steps):
        for numel in lengths:
            xs = world_inputs(comm, step, (numel,), torch.float32)
            want = reference.average_rows(np.stack([x.numpy() for x in xs]))
            where = f"{numel} elements, step {step}"
            out = torch.full((numel,), float("nan"))
            assert exact_average(xs[comm.rank], comm, out, workspace) is out, where
            assert np.array_equal(out.numpy().view(np.uint32), want.view(np.uint32)), where
            mine = xs[comm.rank].clone()
            exact_average(mine, comm, mine, workspace)
            assert torch.equal(mine, out), f"in place: {where}"
            assert_same_on_all_ranks(comm, out, where)
