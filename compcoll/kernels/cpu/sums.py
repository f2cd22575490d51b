"""The CPU kernels' float64 sums in the reference's order: of a compensated vector, segments, accumulated signs.

``LANES`` lanes per ``BLOCK``-element block, then a pairwise tree; the server's sum is of its accumulated signs.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from ...spec import BLOCK, LANES
from .common import SERIAL, add_signs, load, power_of, threaded, unpack


@njit(cache=True, nogil=True)
def tree_sum(values):
    """Pairwise tree sum of float64 values (see ``reference.tree_sum``).

    1. Copy into a zero-padded power-of-two buffer.
    2. Halve it in place, v[i] += v[i + half], until one value is left.
    """
    size = 1
    while size < values.size:
        size *= 2
    v = np.zeros(size, np.float64)
    v[: values.size] = values
    while size > 1:
        size //= 2
        for i in range(size):
            v[i] += v[i + size]
    return v[0]


@threaded
def compensated_power_sum(src, lut, err, n_src, power):
    """Sum of |x|^power (power 2: squares, 1: absolute values) of x = err + src (src zero beyond n_src), writing
    nothing.

    1. Each block of BLOCK elements keeps LANES float64 accumulators; element
       i adds |float64(x_i)|^power to lane i % LANES, in order.
    2. The block-major lane sums are combined by ``tree_sum``.
    Whole rows of LANES elements run through a loop over the lanes whose bound is read from
    the accumulator row (so LLVM vectorizes it instead of unrolling it into scalar code);
    the rest of a block (past n_src or the end) runs element by element.

    Returns the float64 sum; it is not finite when any x_i is not.
    """
    n = err.size
    nblocks = max(1, (n + BLOCK - 1) // BLOCK)
    partial = np.empty((nblocks, LANES), np.float64)
    for b in prange(nblocks):
        lo = b * BLOCK
        count = max(0, min(BLOCK, n - lo))
        valid = min(count, max(0, n_src - lo))
        errs = err[lo:lo + count]
        values = src[lo:lo + valid]
        acc = partial[b]
        lanes = acc.size
        for lane in range(lanes):
            acc[lane] = 0.0
        rows = valid // lanes
        for k in range(rows):
            first = k * lanes
            for lane in range(lanes):
                acc[lane] += power_of(np.float64(errs[first + lane] + load(values, lut, first + lane)), power)
        for i in range(rows * lanes, count):
            x = np.float64(errs[i] + load(values, lut, i) if i < valid else errs[i])
            acc[i % lanes] += power_of(x, power)
    return tree_sum(partial.reshape(-1))


@threaded
def segment_sumsq(x, bounds, firsts, blocks, out):
    """out[j] <- ``compensated_power_sum``'s sum of squares of x[bounds[j]:bounds[j + 1]] alone (its bits), every
    segment in one call.

    1. Every summation block q of every segment (``firsts``: segment j's blocks are q in
       [firsts[j], firsts[j + 1]), at least one, ``blocks`` in all) keeps LANES float64
       accumulators; element i of the block adds float64(x_i)^2 to lane i % LANES, in order.
    2. Each segment's block-major lane sums are combined by ``tree_sum``.
    A block reads its elements through its own slice of ``x``, as ``compensated_power_sum`` does (indexed from the
    start of ``x``, LLVM left the rows' loop scalar: 1.5-2.8 ms against 0.52 at 4.2M float32 elements in 8 segments,
    0.49 against 0.25 ms at 1M in 5, the same bits).
    """
    partial = np.empty((blocks, LANES), np.float64)
    for q in prange(blocks):
        j = np.searchsorted(firsts, q, side="right") - 1
        lo = bounds[j] + (q - firsts[j]) * BLOCK
        count = max(0, min(BLOCK, bounds[j + 1] - lo))
        values = x[lo:lo + count]
        acc = partial[q]
        lanes = acc.size
        for lane in range(lanes):
            acc[lane] = 0.0
        rows = count // lanes
        for k in range(rows):
            first = k * lanes
            for lane in range(lanes):
                acc[lane] += power_of(np.float64(values[first + lane]), 2)
        for i in range(rows * lanes, count):
            acc[i % lanes] += power_of(np.float64(values[i]), 2)
    for j in prange(out.size):
        out[j] = tree_sum(partial[firsts[j]:firsts[j + 1]].reshape(-1))


@threaded
def accumulate_lanes(bits, weights, base, out, n_out, lanes, power):
    """out = sum_r weights[r] * signs(bits[r]) (+ base); ``lanes`` <- the lane sums of its |out|^power.

    ``bits`` is (n, nbytes): row r holds the packed signs of the same n_out elements
    from rank r. ``base`` is None or a float32 vector added after the rank sum (it may
    be ``out`` itself, for an in-place update).
    1. For each element, acc = 0; for r in rank order acc += weights[r] * sign (float32;
       the product is exact, so this is acc +- weights[r]).
    2. out[i] = acc + base[i] (or acc).
    3. |out|^power summed per (block, lane) in the order of ``compensated_power_sum``,
       into ``lanes`` (nblocks * LANES float64, block-major): ``tree_sum(lanes)`` is the
       whole sum, and the lanes of BLOCK-aligned pieces concatenate.
    Each block unpacks rank after rank's bytes into flags (``unpack``) and adds +-weight over all its elements into
    a block of float32 accumulators, the first rank's written as 0 + +-weight (``add_signs``); these loops, the
    base, and the copy to ``out`` beside the powers (lanes bounded as in ``compensated_power_sum``) are elementwise,
    so LLVM vectorizes them. Each block zeroes its own lanes. Until 2026-12-06 the accumulators were zeroed first
    and copied out in a pass of their own: on the 2-core machine (both forms in one process, alternated 4 times, 15
    x 5 calls each, 2 runs; the machine's speed swings, so the fastest call of each run) 1 row of 4M elements 0.77
    and 1.21 -> 0.53 and 0.90 ms, 3 rows of 1M 0.42 and 0.37 -> 0.34 and 0.30, 16 rows of 262,144 0.30 and 0.23 ->
    0.28 and 0.22, every median at or below the old form's in the same run; the same bits.
    """
    nranks = bits.shape[0]
    nblocks = max(1, (n_out + BLOCK - 1) // BLOCK)
    partial = lanes.reshape(nblocks, LANES)
    for b in prange(nblocks):
        lo = b * BLOCK
        count = max(0, min(BLOCK, n_out - lo))
        block_out = out[lo:lo + count]
        flags = np.empty(BLOCK, np.uint8)
        acc = np.zeros(count, np.float32) if nranks == 0 else np.empty(count, np.float32)
        for r in range(nranks):
            unpack(bits[r, lo // 8:(lo + count + 7) // 8], flags)
            add_signs(acc, flags, weights[r], r == 0)
        if base is not None:
            block_base = base[lo:lo + count]
            for e in range(count):
                acc[e] = acc[e] + block_base[e]
        sums = partial[b]
        width = sums.size
        for lane in range(width):
            sums[lane] = 0.0
        rows = count // width
        for k in range(rows):
            first = k * width
            for lane in range(width):
                value = acc[first + lane]
                block_out[first + lane] = value
                sums[lane] += power_of(np.float64(value), power)
        for e in range(rows * width, count):
            block_out[e] = acc[e]
            sums[e - rows * width] += power_of(np.float64(acc[e]), power)


_accumulate_lanes_serial = SERIAL["accumulate_lanes"]


@njit(cache=True, nogil=True)
def accumulate_signs(bits, weights, base, out, n_out, power):
    """``accumulate_lanes``, then the sum of |out|^power: ``tree_sum`` of the lanes."""
    lanes = np.empty(max(1, (n_out + BLOCK - 1) // BLOCK) * LANES, np.float64)
    accumulate_lanes(bits, weights, base, out, n_out, lanes, power)
    return tree_sum(lanes)


@njit(cache=True, nogil=True)
def _accumulate_signs_serial(bits, weights, base, out, n_out, power):
    """``accumulate_signs`` on the serial twin of ``accumulate_lanes``."""
    lanes = np.empty(max(1, (n_out + BLOCK - 1) // BLOCK) * LANES, np.float64)
    _accumulate_lanes_serial(bits, weights, base, out, n_out, lanes, power)
    return tree_sum(lanes)


SERIAL["accumulate_signs"] = _accumulate_signs_serial
SERIAL["tree_sum"] = tree_sum
