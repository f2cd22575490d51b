"""Rank-side bodies of the compressed reduce-scatter tests (run by compcoll.launcher)."""

from __future__ import annotations

import numpy as np
import torch

import compcoll
from compcoll.algorithms.reduce_scatter import OPS, compressed_reduce_scatter, row_elements
from compcoll.spec import LEVEL_BITS
from compcoll.kernels import reference
from tests.shared import world_once
from tests.algorithms.onebit_workers import (
    DTYPES,
    SCALE_NAMES,
    _expect,
    assert_matches_reference,
    make_input,
    world_inputs,
)


def numerics(comm: compcoll.Communicator, rows: list[int], steps: int) -> None:
    """Outputs, worker errors and bytes sent equal the reference step after step, for every dtype, op, scale, bits
    per element and row length (lengths that are not multiples of 8 or of the block); the input is never
    modified."""
    n, rank = comm.size, comm.rank
    for d, dtype in enumerate(DTYPES):
        for i, row in enumerate(rows):
            op = OPS[(i + d) % len(OPS)]
            scale = SCALE_NAMES[(i + d) % 2]
            block = (8, 64, 256)[(i + 2 * d) % 3]
            factor = 0.37 if op == "premul_sum" else 1.0
            bits = LEVEL_BITS[(i + 3 * d) % len(LEVEL_BITS)]
            error = torch.zeros(n * row_elements(n * row, n))
            ref_errors = [np.zeros(error.numel(), np.float32) for _ in range(n)]
            for step in range(steps):
                xs = world_inputs(comm, step, (n * row,), dtype)
                before, sent_before = xs[rank].clone(), comm.bytes_sent
                out = torch.empty(row, dtype=dtype)
                compressed_reduce_scatter(xs[rank], out, error, comm, op=op, factor=factor, block_size=block,
                                          scale=scale, bits=bits)
                sent = comm.bytes_sent - sent_before
                outs, ref_errors, ref_sent = world_once(comm, reference.compressed_reduce_scatter,
                                                        [x.float().numpy() for x in xs], ref_errors, block, scale, op,
                                                        factor, bits)
                where = f"{dtype} {op} {scale} {bits} bit(s) block {block} row {row} step {step}"
                assert torch.equal(xs[rank], before), f"input was modified ({where})"
                assert_matches_reference(out, outs[rank], where)
                assert np.array_equal(error.numpy(), ref_errors[rank]), f"worker error ({where})"
                assert sent == ref_sent[rank], f"bytes sent {sent} != {ref_sent[rank]} ({where})"


def bad_inputs(comm: compcoll.Communicator) -> None:
    """Bad arguments raise a clear error on the rank that passed them and RemoteError elsewhere; a NaN on one rank
    raises NonFiniteError on every rank with no buffer changed; then a good call still works."""
    n, rank = comm.size, comm.rank
    row = 37
    x = make_input(rank, 0, (n * row,), torch.float32)
    out = torch.empty(row)
    error = torch.randn(n * row_elements(n * row, n), generator=torch.Generator().manual_seed(rank)) * 0.01
    crs = compressed_reduce_scatter
    _expect(TypeError, "float32, float16 or bfloat16", crs, x.double(), out, error, comm)
    _expect(ValueError, "out must be a contiguous 1-D tensor of", crs, x, torch.empty(row + 1), error, comm)
    _expect(ValueError, "op 'max' is not one of", crs, x, out, error, comm, op="max")
    _expect(ValueError, f"{error.numel()} elements", crs, x, out, error[:-8], comm)
    _expect(ValueError, "block_size must be", crs, x, out, error, comm, block_size=48)
    _expect(ValueError, "bits must be one of (1, 2, 3, 4, 8), got 5", crs, x, out, error, comm, bits=5)
    if n > 1:
        _expect(ValueError, "multiple of the", crs, x[:-1], out, error, comm)
        bad = x.clone() if rank != n - 1 else x.clone().fill_(float("nan"))
        saved = error.clone()
        for bits in (1, 3):
            _expect(compcoll.NonFiniteError, f"rank(s) [{n - 1}]", crs, bad, out, error, comm, bits=bits)
            assert torch.equal(error, saved), "an error buffer changed"
        other = "sum" if rank == 0 else "avg"
        _expect(compcoll.RankMismatchError, "different ops", crs, x, out, error, comm, op=other)
        if rank == 0:
            _expect(ValueError, "scale", crs, x, out, error, comm, scale="linf")
        else:
            _expect(compcoll.RemoteError, "rank 0", crs, x, out, error, comm)
    _expect(ValueError, "tensor and worker_error share memory", crs, error[:n * row], out, error, comm)
    _expect(ValueError, "out and worker_error share memory", crs, x, error[:row], error, comm)
    before = error.clone()
    crs(x, out, error, comm)
    assert torch.isfinite(out).all()
    in_place, again = x.clone(), before.clone()
    crs(in_place, in_place[rank * row:(rank + 1) * row], again, comm)
    assert torch.equal(in_place[rank * row:(rank + 1) * row], out) and torch.equal(again, error), \
        "out inside the tensor (this rank's row of it) gave other bits than out of its own"
