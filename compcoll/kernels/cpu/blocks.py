"""The CPU kernels of the block forms (a scale per block of elements).

The blocks' sums and maxima, the encode, the accumulation of signs (and of groups of rows), and the decode on raw
bits.
"""

from __future__ import annotations

import numpy as np
from numba import prange

from ...spec import BLOCK
from .common import (add_signs, block_bounds, larger_or_nan, load, pack, power_of, row_task, segment_task, store_sum,
                     threaded, unpack)

SUMMED_TOGETHER = 8
"""Whole blocks ``block_power_sums`` sums side by side, each in its own order: one float64 sum's chain of adds
waited on the one before (2 of 4194304 float32 elements by 64: 1.84 ms, 8 side by side 1.20, 2 1.13, 16 1.90)."""
MAXIMA = 8
"""Running maxima ``block_absmax`` keeps of a block, its neighbouring elements' in turn (the smallest block is 8)."""


@threaded
def block_power_sums(src, lut, err, n_src, block, row_len, power, sums):
    """sums[r * m + b] = sum of |x_i|^power over block b of row r, x = err + src (rows of row_len elements).

    A row's blocks are ``block`` elements from its start, m = ceil(row_len / block) of them,
    the last one shorter where needed; src is zero beyond n_src. Each block is summed
    sequentially in float64 (every |x| and square exact), as ``reference.block_sums``;
    blocks in parallel, BLOCK elements' worth of them per task:
    1. ``SUMMED_TOGETHER`` whole blocks of one row, all within n_src: their sums side by side, element e of each
       in turn (independent chains of adds, each in its block's order).
    2. Any other block (a row's last, one reaching past n_src, a task's last few) alone.
    """
    per_row = (row_len + block - 1) // block
    whole = row_len // block
    per_task = max(1, BLOCK // block)
    group = SUMMED_TOGETHER
    for t in prange((sums.size + per_task - 1) // per_task):
        b, stop = t * per_task, min(sums.size, (t + 1) * per_task)
        accs = np.zeros(group, np.float64)
        while b < stop:
            r = b // per_row
            first = r * row_len + (b - r * per_row) * block
            if b + group <= stop and b - r * per_row + group <= whole and first + group * block <= n_src:
                errs = err[first:first + group * block]
                values = src[first:first + group * block]
                accs[:] = 0.0
                for e in range(block):
                    for j in range(group):
                        accs[j] += power_of(np.float64(errs[j * block + e] + load(values, lut, j * block + e)), power)
                sums[b:b + group] = accs
                b += group
                continue
            last = min(first + block, (r + 1) * row_len)
            acc = 0.0
            for i in range(first, last):
                x = err[i] + load(src, lut, i) if i < n_src else err[i]
                acc += power_of(np.float64(x), power)
            sums[b] = acc
            b += 1


@threaded
def encode_blocks(src, lut, err, n_src, scales, block, bits):
    """``compensate_encode`` with one scale per block: err[i] = x - (+-scales[r * m + k // block]).

    ``bits`` is (rows, row_bytes), possibly a strided view (rows behind their scales): row r
    holds elements [r * 8 * row_bytes, (r + 1) * 8 * row_bytes); element k of the row is in
    its block k // block, m = ceil(8 * row_bytes / block) blocks per row. Each task takes up
    to BLOCK elements of one row (a multiple of ``block``, a power of two up to BLOCK), writes their bits as bytes
    0/1, then packs them. A block's elements with a source, then those past n_src, each run through a loop over
    their own slices from zero, as ``compensate_encode``'s (indexed from the arrays' starts with a test of n_src
    for every element, LLVM left it scalar: 5.9 -> 1.0 ms at 4194304 float32 elements by 64).
    """
    rows, row_bytes = bits.shape
    per_row = (8 * row_bytes + block - 1) // block
    per_task = BLOCK // 8
    tasks_per_row = (row_bytes + per_task - 1) // per_task
    for t in prange(rows * tasks_per_row):
        r, lo, hi, first, count, valid = row_task(t, tasks_per_row, per_task, row_bytes, n_src)
        errs = err[first:first + count]
        values = src[first:first + valid]
        flags = np.empty(count, np.uint8)
        for k in range((count + block - 1) // block):
            s = scales[r * per_row + lo * 8 // block + k]
            a, z, sourced, past = block_bounds(k, block, count, valid)
            if sourced > a:
                block_errs, block_values, block_flags = errs[a:sourced], values[a:sourced], flags[a:sourced]
                for e in range(sourced - a):
                    x = block_errs[e] + load(block_values, lut, e)
                    block_flags[e] = x >= 0
                    block_errs[e] = x - s if x >= 0 else x + s
            if z > past:
                block_errs, block_flags = errs[past:z], flags[past:z]
                for e in range(z - past):
                    x = block_errs[e]
                    block_flags[e] = x >= 0
                    block_errs[e] = x - s if x >= 0 else x + s
        pack(flags, bits[r, lo:hi])


@threaded
def accumulate_blocks(bits, weights, block, base, out, n_out):
    """out = sum_r weights[r, i // block] * signs(bits[r]) (+ base), rank by rank in float32.

    ``bits`` is (n, row_bytes), row r the packed signs of the same n_out elements from rank
    r (possibly a strided view); ``weights`` is (n, blocks); ``base`` as in
    ``accumulate_lanes`` (it may be ``out``). Every product is exact, so each step is
    acc +- w, as ``reference.average_block_signs``. A block's steps run over its own slices from zero (2.75 -> 0.76
    ms at 4194304 elements by 64, one row), the first rank's written, not added to zeros (``common.add_signs``), and
    the sums stored once (``common.store_sum``): 0.67-1.38 -> 0.54-0.69 ms there (2026-12-06, both forms in one
    process, alternated 4 times, medians of 9 x 5), 16 rows of 262,144 0.33-0.34 -> 0.32.
    """
    nranks = bits.shape[0]
    ntasks = (n_out + BLOCK - 1) // BLOCK
    for t in prange(ntasks):
        lo = t * BLOCK
        count = min(BLOCK, n_out - lo)
        flags = np.empty(BLOCK, np.uint8)
        acc = np.zeros(count, np.float32) if nranks == 0 else np.empty(count, np.float32)
        for r in range(nranks):
            unpack(bits[r, lo // 8:(lo + count + 7) // 8], flags)
            for k in range((count + block - 1) // block):
                a, z, _, _ = block_bounds(k, block, count, count)
                add_signs(acc[a:z], flags[a:z], weights[r, lo // block + k], r == 0)
        store_sum(acc, base, lo, out)


@threaded
def accumulate_groups(bits, weights, out, n_out):
    """out[j * seg + t] = sum_r weights[j, r] * signs(bits[j * m + r])[t], rank by rank in float32 from 0, for
    j * seg + t < n_out (seg = 8 * row_bytes, m = weights.shape[1]): group j's m rows summed into segment j of
    ``out``, each element as ``accumulate_lanes`` sums it (acc +- w, every product exact, ``common.add_signs``).
    Each task takes up to BLOCK elements of one segment, stored through a slice from zero (``common.store_sum``;
    indexed from the segment's start until 2026-12-06: 4 groups of 4 rows of 1M elements 2.1-3.7 -> 0.8-1.6 ms,
    alternated as ``accumulate_blocks``)."""
    groups, members = weights.shape
    seg = 8 * bits.shape[1]
    tasks_per_group = (seg + BLOCK - 1) // BLOCK
    for t in prange(groups * tasks_per_group):
        j, lo, first, count = segment_task(t, tasks_per_group, seg, n_out)
        if count > 0:
            flags = np.empty(BLOCK, np.uint8)
            acc = np.zeros(count, np.float32) if members == 0 else np.empty(count, np.float32)
            for r in range(members):
                unpack(bits[j * members + r, lo // 8:(lo + count + 7) // 8], flags)
                add_signs(acc, flags, weights[j, r], r == 0)
            store_sum(acc, None, first, out)


@threaded
def decode_blocks(bits, scales, block, sign, out, n_out):
    """out[i] = +-scales[r, k // block] for element k of row r of ``bits`` (set bit: +), cut to n_out, on raw bits.

    ``bits`` is (rows, row_bytes) (possibly strided); ``scales`` (rows, 8 * row_bytes / block) and ``out`` hold
    the raw bits of one float dtype (uint32 for float32, uint16 for a 16-bit one), and ``sign`` is its sign bit:
    -s is s with that bit flipped. A task's blocks in turn, each block's scale and its flipped one read once, its
    elements through its own slices from zero (a scale looked up by a division for every element: 5.9 -> 0.36 ms
    at 4194304 elements by 64).
    """
    rows, row_bytes = bits.shape
    per_task = BLOCK // 8
    tasks_per_row = (row_bytes + per_task - 1) // per_task
    for t in prange(rows * tasks_per_row):
        r, lo, hi, start, _, count = row_task(t, tasks_per_row, per_task, row_bytes, n_out)
        if count:
            flags = np.empty(BLOCK, np.uint8)
            unpack(bits[r, lo:hi], flags)
            dest = out[start:start + count]
            for k in range((count + block - 1) // block):
                s = scales[r, lo * 8 // block + k]
                flipped = s ^ sign
                a, z, _, _ = block_bounds(k, block, count, count)
                block_dest, block_flags = dest[a:z], flags[a:z]
                for e in range(z - a):
                    block_dest[e] = s if block_flags[e] else flipped


@threaded
def block_absmax(src, lut, err, n_src, block, row_len, out):
    """out[r * m + b] = max |x| over block b of row r of x = err + src (``block_power_sums``' blocks), float32; NaN
    where the block holds NaN, as ``reference.block_absmax``; blocks in parallel.

    A block's elements with a source run ``MAXIMA`` at a time into as many running maxima (independent steps, which
    LLVM vectorizes; one running maximum, stopped at a NaN, waited on its last step: 6.8 -> 2.3 ms at 4194304
    float32 elements by 64), the rest element by element, then the running maxima: a maximum that keeps NaN takes
    any order.
    """
    per_row = (row_len + block - 1) // block
    per_task = max(1, BLOCK // block)
    for t in prange((out.size + per_task - 1) // per_task):
        tops = np.zeros(MAXIMA, np.float32)
        width = tops.size
        for b in range(t * per_task, min(out.size, (t + 1) * per_task)):
            r = b // per_row
            first = r * row_len + (b - r * per_row) * block
            last = min(first + block, (r + 1) * row_len)
            sourced = max(first, min(last, n_src))
            errs = err[first:last]
            values = src[first:sourced]
            count, valid = last - first, sourced - first
            tops[:] = 0.0
            whole = valid // width
            for k in range(whole):
                at = k * width
                for lane in range(width):
                    x = errs[at + lane] + load(values, lut, at + lane)
                    tops[lane] = larger_or_nan(tops[lane], abs(np.float32(x)))
            top = np.float32(0)
            for e in range(whole * width, count):
                x = errs[e] + load(values, lut, e) if e < valid else errs[e]
                top = larger_or_nan(top, abs(np.float32(x)))
            for lane in range(width):
                top = larger_or_nan(top, tops[lane])
            out[b] = top
