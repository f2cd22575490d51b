"""Rank-side bodies of the GPU tests: compcoll's collectives on CUDA tensors against the reference."""

from __future__ import annotations

import numpy as np
import torch

import compcoll
from compcoll.kernels import reference
from tests.algorithms.onebit_workers import assert_errors_match, assert_matches_reference, make_input


def cuda_numerics(comm: compcoll.Communicator, shapes: list[list[int]], steps: int) -> None:
    """compressed_allreduce and hierarchical_allreduce on CUDA tensors equal the CPU reference, bit for bit."""
    n, rank = comm.size, comm.rank
    device = torch.device("cuda", torch.cuda.current_device())
    for dtype in (torch.float32, torch.float16, torch.bfloat16):
        for shape in map(tuple, shapes):
            numel = int(np.prod(shape))
            full = compcoll.padded_numel(numel, n)
            we = torch.zeros(full, device=device)
            se = torch.zeros(full // n, device=device)
            ref_we = [np.zeros(full, np.float32) for _ in range(n)]
            ref_se = [np.zeros(full // n, np.float32) for _ in range(n)]
            for step in range(steps):
                xs = [make_input(q, step, shape, dtype) for q in range(n)]
                out = compcoll.compressed_allreduce(xs[rank].to(device), we, se, comm)
                assert out.device == device
                outs, ref_we, ref_se, _ = reference.compressed_allreduce(
                    [x.float().reshape(-1).numpy() for x in xs], ref_we, ref_se)
                where = f"{dtype} shape {shape} step {step}"
                assert_matches_reference(out.cpu(), outs[rank], where)
                assert_errors_match(we.cpu(), se.cpu(), ref_we[rank], ref_se[rank], where)
                hier = compcoll.hierarchical_allreduce(xs[rank].to(device), comm, ranks_per_node=1, seed=5, step=step)
                ref_hier, _ = reference.hierarchical_allreduce([x.float().reshape(-1).numpy() for x in xs], 1, 5, step)
                assert_matches_reference(hier.cpu(), ref_hier[rank], "hierarchical " + where)
