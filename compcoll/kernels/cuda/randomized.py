"""Birder's kernels on the device: the rows' largest magnitudes, and the binary randomized encode."""

from __future__ import annotations

import math
from functools import lru_cache

import numpy as np
from numba import cuda

from .. import scalar
from ...spec import BLOCK, LANES, SCALE_BYTES
from ..launch import launch
from .common import (IN_FLIGHT, LOOKUPS, RAW_TYPES, THREADS, TILE, device_empty, finite_slots, grid_for, pack,
                     row_of, table_arg)
from .frames import write_head

_threshold = cuda.jit(device=True)(scalar.threshold)
_larger_or_nan = cuda.jit(device=True)(scalar.larger_or_nan)


ROW_A_THREAD = 8
"""Pieces a row (of ``BLOCK`` elements, ``LANES`` partial maxima each) up to which the last block of ``row_absmax``
gives each of its threads whole rows (many short rows: an n-rank call's maxima of a small tensor); past it the
block's threads reduce each row together, one row after another."""


@lru_cache(maxsize=None)
def _absmax_lanes(with_lut: bool):
    """The kernel of ``row_absmax``: the lanes' partial maxima, then the rows' by the last block to finish."""
    look_up = LOOKUPS[with_lut]

    @cuda.jit
    def kernel(src, lut, n_src, row_len, per_row, by_thread, partial, out, counts, finite):
        held = cuda.local.array(IN_FLIGHT, np.float32)
        best = cuda.shared.array(THREADS, np.float32)
        last = cuda.shared.array(1, np.int32)
        tid = cuda.threadIdx.x
        for t in range(cuda.grid(1), partial.size, cuda.gridsize(1)):
            lane = t % LANES
            piece = t // LANES
            row = piece // per_row
            lo = row * row_len + (piece % per_row) * BLOCK
            hi = lo + BLOCK
            if (row + 1) * row_len < hi:
                hi = (row + 1) * row_len
            if n_src < hi:
                hi = n_src
            m = np.float32(0)
            for first in range(lo + lane, hi, IN_FLIGHT * LANES):
                for u in range(IN_FLIGHT):
                    i = first + u * LANES
                    held[u] = look_up(lut, src[i]) if i < hi else np.float32(0)
                for u in range(IN_FLIGHT):
                    a = held[u]
                    if a < 0:
                        a = -a
                    m = _larger_or_nan(m, a)
            partial[t] = m
        cuda.syncthreads()
        if tid == 0:
            cuda.threadfence()
            done = cuda.atomic.add(counts, 0, 1) == cuda.gridDim.x - 1
            if done:
                counts[0] = 0
                cuda.threadfence()
            last[0] = 1 if done else 0
        cuda.syncthreads()
        if last[0] == 0:
            return
        span = per_row * LANES
        if by_thread:
            bad = 0
            for r in range(tid, out.size, THREADS):
                m = np.float32(0)
                for t in range(r * span, (r + 1) * span):
                    m = _larger_or_nan(m, partial[t])
                out[r] = m
                if not math.isfinite(m):
                    bad = 1
            if cuda.syncthreads_or(bad) == 0:
                if tid == 0:
                    finite[0] = 0.0
            elif tid == 0:
                finite[0] = math.nan
            return
        finite_rows = True
        for r in range(out.size):
            m = np.float32(0)
            end = (r + 1) * span
            for first in range(r * span + tid, end, IN_FLIGHT * THREADS):
                for u in range(IN_FLIGHT):
                    t = first + u * THREADS
                    held[u] = partial[t] if t < end else np.float32(0)
                for u in range(IN_FLIGHT):
                    m = _larger_or_nan(m, held[u])
            best[tid] = m
            cuda.syncthreads()
            width = THREADS // 2
            while width > 0:
                if tid < width:
                    best[tid] = _larger_or_nan(best[tid], best[tid + width])
                cuda.syncthreads()
                width //= 2
            if tid == 0:
                out[r] = best[0]
                if not math.isfinite(best[0]):
                    finite_rows = False
            cuda.syncthreads()
        if tid == 0:
            finite[0] = 0.0 if finite_rows else math.nan

    return kernel


def row_absmax(src, lut, n_src, row_len, out, stream=0, empty=device_empty, finite=None) -> None:
    """out[r] = max |x| over row r of x (src zero-padded beyond n_src); NaN if the row holds one; and finite[0] (a
    float64, where given) <- 0.0 where every maximum is finite, else NaN; in one launch.

    The maximum does not depend on the order:
    1. lane l of piece q (``BLOCK`` elements of a row) keeps the partial maximum of its elements l, l + ``LANES``,
       ..., ``IN_FLIGHT`` loads before it compares any, into partial[q * LANES + l];
    2. each block's thread 0 fences (its block's partial maxima, ordered before it by a barrier, made visible) and
       counts the block in counts[0]; the block that counts last zeroes the count for the stream's next launch and
       fences again;
    3. that block reduces each row's partial maxima into out[r]: rows of up to ``ROW_A_THREAD`` pieces a thread
       each (the rows side by side); longer rows one after another, its threads striding over each, ``IN_FLIGHT``
       loads a thread before it compares them, then a tree in shared memory; and writes ``finite``. A second
       launch of one block a row did steps 2-3 until 2026-12-05 (its threads one load at a time): three launches
       more a Birder call. Long rows are now reduced one after another, which a block a row did side by side: at
       n rows of a large tensor (the agreement's maxima of an n-rank call) the last block walks them all.
    """
    per_row = max(1, -(-row_len // BLOCK))
    partial = empty(out.size * per_row * LANES, np.float32, stream)
    launch(_absmax_lanes(lut is not None), grid_for(partial.size), THREADS, stream,
           src, table_arg(lut, stream), n_src, row_len, per_row, per_row <= ROW_A_THREAD, partial, out,
           *finite_slots(stream, finite))


@lru_cache(maxsize=None)
def _randomized_encode(with_lut: bool):
    look_up, raw_type = LOOKUPS[with_lut], RAW_TYPES[with_lut]

    @cuda.jit
    def kernel(src, lut, n_src, scales, key, start, rows):
        signs = cuda.shared.array(TILE, np.uint8)
        head = cuda.local.array(1, np.float32)
        raw = cuda.local.array(8, raw_type)
        scale = cuda.local.array(8, np.float32)
        lane = cuda.threadIdx.x
        n, width = rows.shape
        row_bytes = width - SCALE_BYTES
        stream_key = key[0]
        for r in range(cuda.grid(1), n, cuda.gridsize(1)):
            write_head(rows, r, scales[r], head)
        total = n * row_bytes
        row_len = row_bytes * 8
        r, first = 0, 0
        byte_row, first_byte = 0, 0
        for tile in range(cuda.blockIdx.x, -(-total // THREADS), cuda.gridDim.x):
            base = tile * TILE
            r, first = row_of(base, r, first, row_len)
            whole = base + TILE <= min(n_src, first + row_len)
            src_at = src[base + lane:]
            if whole:
                for j in range(8):
                    raw[j] = src_at[j * THREADS]
                    scale[j] = scales[r]
            else:
                for j in range(8):
                    i = base + j * THREADS + lane
                    if i < total * 8:
                        r, first = row_of(i, r, first, row_len)
                        raw[j] = src_at[j * THREADS] if i < n_src else 0
                        scale[j] = scales[r]
            for j in range(8):
                e = j * THREADS + lane
                i = base + e
                if whole or i < total * 8:
                    x = np.float64(look_up(lut, raw[j])) if whole or i < n_src else 0.0
                    signs[e] = 1 if x > _threshold(stream_key, start + i) * np.float64(scale[j]) else 0
            cuda.syncthreads()
            t = tile * THREADS + lane
            if t < total:
                byte_row, first_byte = row_of(t, byte_row, first_byte, row_bytes)
                rows[byte_row, SCALE_BYTES + t - first_byte] = pack(signs, 8 * lane)
            cuda.syncthreads()

    return kernel


def randomized_encode(src, lut, n_src, scales, key, start, rows, stream=0) -> None:
    """Wire row r <- scales[r] at its head, then Birder's binary randomization of row r of x: bit i set when
    x_i > t_i * scale_r, as the CPU kernel (the head written by the kernel: no copy by torch).

    ``key`` is a one-element uint64 device array holding the stream's key, which the kernel reads from there (the
    CPU kernel takes it as a value): a launch replayed with the next call's key in that memory draws that call's
    thresholds (``codecs.stream_keys``).

    Tiled as ``signs.compensate_encode``: coalesced element reads, signs staged in shared memory; a thread keeps the
    row of its last element (and of its last byte) and divides only when it leaves it. A thread loads its 8
    elements of a tile (raw) and their rows' scales first, then looks them up, draws and compares: each element's
    loads behind the previous element's store waited a memory round trip an element. A tile inside one row and
    inside the source loads at constant offsets with no bounds check or row walk (``blocks.tiled_block_encoder``).
    """
    launch(_randomized_encode(lut is not None), grid_for(rows.shape[0] * (rows.shape[1] - SCALE_BYTES)), THREADS,
           stream, src, table_arg(lut, stream), n_src, scales, key, start, rows)
