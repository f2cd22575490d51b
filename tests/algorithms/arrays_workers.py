"""Rank-side bodies of the array tests: numpy arrays through every allreduce, against the reference."""

from __future__ import annotations

import numpy as np
import torch

import compcoll
from compcoll.kernels import reference
from tests.shared import world_once
from tests.algorithms.onebit_workers import world_inputs

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


def _check(got: object, source: np.ndarray, expected: np.ndarray, out: np.ndarray | None, where: str) -> None:
    """A numpy array of the source's shape and dtype, the reference's bits, viewing ``out`` when given."""
    assert isinstance(got, np.ndarray), f"{where}: got a {type(got).__name__}"
    assert got.shape == source.shape and got.dtype == source.dtype, where
    want = torch.from_numpy(expected).to(torch.from_numpy(source).dtype).numpy().reshape(source.shape)
    assert np.array_equal(got.view(np.uint8), want.view(np.uint8)), f"{where}: output"
    assert out is None or np.shares_memory(got, out), f"{where}: the result is not a view of out"
