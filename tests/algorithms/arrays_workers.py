"""Rank-side bodies of the array tests: numpy arrays through every allreduce, against the reference."""

from __future__ import annotations

import numpy as np
import torch

import compcoll
from compcoll.kernels import reference
from compcoll.algorithms.reduce_scatter import BLOCK_SIZE, row_elements
from tests.shared import world_once
from tests.algorithms.onebit_workers import _expect, world_inputs

SHAPES = ((37,), (3, 7, 11))


def numpy_arrays(comm: compcoll.Communicator, steps: int) -> None:
    """numpy in, numpy out: every allreduce equals the reference, error buffers (numpy) updated in place.

    Odd steps run asynchronously, and write into a numpy ``out`` whose memory the result must view.
    """
    n, rank = comm.size, comm.rank
    for dtype in (torch.float32, torch.float16):
        for shape in SHAPES:
            numel = int(np.prod(shape))
            full = compcoll.padded_numel(numel, n)
            we, se = np.zeros(full, np.float32), np.zeros(full // n, np.float32)
            wn, sn = compcoll.hierarchical_error_numels(numel, n, n)
            hwe, hse = np.zeros(wn, np.float32), np.zeros(sn, np.float32)
            ref_we, ref_se = [np.zeros(full, np.float32)] * n, [np.zeros(full // n, np.float32)] * n
            ref_hwe, ref_hse = [np.zeros(wn, np.float32)] * n, [np.zeros(sn, np.float32)] * n
            for step in range(steps):
                xs = world_inputs(comm, step, shape, dtype)
                flat = [x.float().reshape(-1).numpy() for x in xs]
                mine = xs[rank].numpy()
                where = f"{dtype} {shape} step {step}"
                asynchronous = step % 2 == 1
                out = np.empty_like(mine) if asynchronous else None
                got = compcoll.compressed_allreduce(mine, we, se, comm, out=out, async_op=asynchronous)
                got = got.wait() if asynchronous else got
                outs, ref_we, ref_se, _ = world_once(comm, reference.compressed_allreduce, flat, ref_we, ref_se)
                _check(got, mine, outs[rank], out, where)
                assert np.array_equal(we, ref_we[rank]) and np.array_equal(se, ref_se[rank]), where
                got = compcoll.hierarchical_compressed_allreduce(mine, hwe, hse, comm, ranks_per_node=n)
                outs, ref_hwe, ref_hse, _ = world_once(comm, reference.hierarchical_compressed_allreduce, flat, ref_hwe,
                                                       ref_hse, n)
                _check(got, mine, outs[rank], None, "hierarchical compensated " + where)
                assert np.array_equal(hwe, ref_hwe[rank]) and np.array_equal(hse, ref_hse[rank]), where
                work = compcoll.hierarchical_allreduce(mine, comm, ranks_per_node=1, seed=3, step=step, async_op=True)
                got = work.get_future().wait()
                assert work.wait() is not got and np.shares_memory(work.wait(), got)
                _check(got, mine, world_once(comm, reference.hierarchical_allreduce, flat, 1, 3, step)[0][rank], None,
                       "hierarchical " + where)


def keyed_and_scattered(comm: compcoll.Communicator, steps: int) -> None:
    """numpy through ``CompressedAllreduce`` (a method: its error buffers its own) and ``compressed_reduce_scatter``
    (numpy input, output and error buffer), against the reference step after step; an input with a negative stride
    (``a[::-1]``, which torch's ``from_dlpack`` aborts the process on) gives what its contiguous copy gives, and an
    error buffer with one is refused with a TypeError naming why. Before 2026-12-03 both entry points refused numpy
    ("must be ... an array that exports DLPack (numpy, cupy), got numpy.ndarray"), and a reversed array ended the
    process."""
    n, rank = comm.size, comm.rank
    numel, row = 1001, 37
    full = compcoll.padded_numel(numel, n)
    keyed = compcoll.CompressedAllreduce(comm)
    ref_we, ref_se = [np.zeros(full, np.float32)] * n, [np.zeros(full // n, np.float32)] * n
    error = np.zeros(n * row_elements(n * row, n), np.float32)
    ref_errors = [np.zeros(error.size, np.float32)] * n
    for step in range(steps):
        where = f"step {step}"
        xs = world_inputs(comm, step, (numel,), torch.float32)
        mine = xs[rank].numpy()[::-1] if step % 2 else xs[rank].numpy()
        flat = [x.numpy()[::-1].copy() if step % 2 else x.numpy() for x in xs]
        got = keyed(mine, key="layer")
        outs, ref_we, ref_se, _ = world_once(comm, reference.compressed_allreduce, flat, ref_we, ref_se)
        _check(got, flat[rank], outs[rank], None, "CompressedAllreduce " + where)
        worker, server = keyed.plans["layer"].error_feedback.buffers()
        assert np.array_equal(worker.numpy(), ref_we[rank]) and np.array_equal(server.numpy(), ref_se[rank]), where
        rows = world_inputs(comm, 100 + step, (n * row,), torch.float32)
        out = np.empty(row, np.float32)
        got = compcoll.compressed_reduce_scatter(rows[rank].numpy(), out, error, comm)
        outs, ref_errors, _ = world_once(comm, reference.compressed_reduce_scatter, [x.numpy() for x in rows],
                                         ref_errors, BLOCK_SIZE, "l2", "avg", 1.0, 1)
        _check(got, out, outs[rank], out, "compressed_reduce_scatter " + where)
        assert np.array_equal(error, ref_errors[rank]), f"reduce-scatter error buffer ({where})"
    x = world_inputs(comm, 0, (numel,), torch.float32)[rank].numpy()
    _expect(TypeError, "cannot view (read-only where the call writes it, a negative stride",
            compcoll.compressed_allreduce, x, np.zeros(full, np.float32)[::-1], np.zeros(full // n, np.float32), comm)


def _check(got: object, source: np.ndarray, expected: np.ndarray, out: np.ndarray | None, where: str) -> None:
    """A numpy array of the source's shape and dtype, the reference's bits, viewing ``out`` when given."""
    assert isinstance(got, np.ndarray), f"{where}: got a {type(got).__name__}"
    assert got.shape == source.shape and got.dtype == source.dtype, where
    want = torch.from_numpy(expected).to(torch.from_numpy(source).dtype).numpy().reshape(source.shape)
    assert np.array_equal(got.view(np.uint8), want.view(np.uint8)), f"{where}: output"
    assert out is None or np.shares_memory(got, out), f"{where}: the result is not a view of out"
