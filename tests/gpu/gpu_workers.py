"""Rank-side bodies of the GPU tests: compcoll's collectives on CUDA tensors against the reference."""

from __future__ import annotations

import numpy as np
import torch

import compcoll
from compcoll.kernels import reference
from tests.algorithms.onebit_workers import assert_errors_match, assert_matches_reference, make_input


def cuda_numerics(comm: compcoll.Communicator, shapes: list[list[int]], steps: int) -> None:
    """compressed_allreduce and both hierarchical forms (one node of n ranks for the compensated one) on CUDA equal the reference.

    Odd steps run the compensated calls asynchronously (a side stream, waited on), the flat
    one in 3 pieces.
    """
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
            wn, sn = compcoll.hierarchical_error_numels(numel, n, n)
            hwe, hse = torch.zeros(wn, device=device), torch.zeros(sn, device=device)
            ref_hwe, ref_hse = [np.zeros(wn, np.float32) for _ in range(n)], [np.zeros(sn, np.float32) for _ in range(n)]
            for step in range(steps):
                xs = [make_input(q, step, shape, dtype) for q in range(n)]
                flat = [x.float().reshape(-1).numpy() for x in xs]
                asynchronous = step % 2 == 1
                out = compcoll.compressed_allreduce(xs[rank].to(device), we, se, comm, async_op=asynchronous,
                                                    pieces=3 if asynchronous else 1)
                out = out.wait() if asynchronous else out
                assert out.device == device
                outs, ref_we, ref_se, _ = reference.compressed_allreduce(flat, ref_we, ref_se)
                where = f"{dtype} shape {shape} step {step}"
                assert_matches_reference(out.cpu(), outs[rank], where)
                assert_errors_match(we.cpu(), se.cpu(), ref_we[rank], ref_se[rank], where)
                hier = compcoll.hierarchical_allreduce(xs[rank].to(device), comm, ranks_per_node=1, seed=5, step=step)
                ref_hier, _ = reference.hierarchical_allreduce(flat, 1, 5, step)
                assert_matches_reference(hier.cpu(), ref_hier[rank], "hierarchical " + where)
                out = compcoll.hierarchical_compressed_allreduce(xs[rank].to(device), hwe, hse, comm, ranks_per_node=n,
                                                                 async_op=asynchronous)
                out = out.wait() if asynchronous else out
                outs, ref_hwe, ref_hse, _ = reference.hierarchical_compressed_allreduce(flat, ref_hwe, ref_hse, n)
                assert_matches_reference(out.cpu(), outs[rank], "hierarchical compensated " + where)
                assert_errors_match(hwe.cpu(), hse.cpu(), ref_hwe[rank], ref_hse[rank], "hierarchical " + where)
