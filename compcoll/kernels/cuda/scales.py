"""The block forms' scales on the device: coded against each row's largest, framed behind its head, and decoded."""

from __future__ import annotations

from functools import lru_cache

import numpy as np
from numba import cuda

from .. import scalar
from ...spec import SCALE_BYTES
from ..launch import launch
from .common import IN_FLIGHT, THREADS, device_empty, grid_for, row_of
from .frames import code_value, row_ref, write_head

CODE_THREADS = 256
"""Threads of a block of the scale coders: one block codes one row, or a part of one (a power of two, for its max's
tree)."""
CODE_SCALES_PER_THREAD = 8
"""Block scales a coding thread takes at most before a row is split over blocks (``code_blocks``' two launches)."""
_block_scale = cuda.jit(device=True)(scalar.block_scale)
_nearest_code = cuda.jit(device=True)(scalar.nearest_code)


@cuda.jit(device=True)
def _block_max(top, value):
    """The largest of the block's threads' ``value``s, by a tree in shared ``top``, for every thread."""
    tid = cuda.threadIdx.x
    top[tid] = value
    cuda.syncthreads()
    half = CODE_THREADS // 2
    while half > 0:
        if tid < half:
            top[tid] = max(top[tid], top[tid + half])
        cuda.syncthreads()
        half //= 2
    return top[0]


SUM_TYPES = {2: np.float64, 1: np.float64}
"""A coder's input element type by power: the float64 sums of |x|^power; else (0, the levels' negative powers)
float32 scales or maxima."""


@cuda.jit(device=True)
def _scales_of(src, block, row_len, power, decoded, r, first, stride, held):
    """decoded[r, b] <- block b's scale for b = first, first + stride, ... of row r; returns the largest of them.

    ``IN_FLIGHT`` blocks a round: their inputs loaded into ``held`` (a local array of ``src``'s type) first, then
    their scales computed and stored (an input's load behind the previous scale's store waited a round trip)."""
    m = decoded.shape[1]
    largest = np.float32(0.0)
    for k in range(first, m, IN_FLIGHT * stride):
        for u in range(IN_FLIGHT):
            b = k + u * stride
            held[u] = src[r * m + b] if b < m else 0
        for u in range(IN_FLIGHT):
            b = k + u * stride
            if b < m:
                s = _block_scale(held, u, block if b < m - 1 else row_len - (m - 1) * block, power)
                decoded[r, b] = s
                largest = max(largest, s)
    return largest


@cuda.jit(device=True)
def _code_row(ref, steps, values, head, rows, decoded, r, first, stride, writes_head, scales):
    """Row r's codes against its largest scale ref for b = first, first + stride, ...: the 256 values
    float32(float64(ref) * steps[k]) in shared ``values``, ref's 4 bytes at the row's head (``writes_head``: thread 0),
    each scale's code behind it and its decoded value over it; ``IN_FLIGHT`` scales a round loaded into ``scales``
    (a float32 local array) before any is coded and stored."""
    tid = cuda.threadIdx.x
    for k in range(tid, 256, CODE_THREADS):
        values[k] = np.float32(np.float64(ref) * steps[k])
    if writes_head and tid == 0:
        write_head(rows, r, ref, head)
    cuda.syncthreads()
    m = decoded.shape[1]
    for k in range(first, m, IN_FLIGHT * stride):
        for u in range(IN_FLIGHT):
            b = k + u * stride
            scales[u] = decoded[r, b] if b < m else np.float32(0)
        for u in range(IN_FLIGHT):
            b = k + u * stride
            if b < m:
                code = _nearest_code(values, scales[u])
                rows[r, SCALE_BYTES + b] = code
                decoded[r, b] = values[code]
    cuda.syncthreads()


@lru_cache(maxsize=None)
def _code_blocks(power: int):
    sum_type = SUM_TYPES.get(power, np.float32)

    @cuda.jit
    def kernel(src, block, row_len, steps, rows, decoded):
        tid = cuda.threadIdx.x
        top = cuda.shared.array(CODE_THREADS, np.float32)
        values = cuda.shared.array(256, np.float32)
        head = cuda.local.array(1, np.float32)
        held = cuda.local.array(IN_FLIGHT, sum_type)
        scales = cuda.local.array(IN_FLIGHT, np.float32)
        for r in range(cuda.blockIdx.x, decoded.shape[0], cuda.gridDim.x):
            largest = _scales_of(src, block, row_len, power, decoded, r, tid, CODE_THREADS, held)
            ref = _block_max(top, largest)
            _code_row(ref, steps, values, head, rows, decoded, r, tid, CODE_THREADS, True, scales)

    return kernel


@lru_cache(maxsize=None)
def _part_maxima(power: int):
    sum_type = SUM_TYPES.get(power, np.float32)

    @cuda.jit
    def kernel(src, block, row_len, parts, decoded, maxima):
        tid = cuda.threadIdx.x
        top = cuda.shared.array(CODE_THREADS, np.float32)
        held = cuda.local.array(IN_FLIGHT, sum_type)
        for q in range(cuda.blockIdx.x, decoded.shape[0] * parts, cuda.gridDim.x):
            r, g = q // parts, q % parts
            largest = _scales_of(src, block, row_len, power, decoded, r, g * CODE_THREADS + tid, parts * CODE_THREADS,
                                 held)
            top_value = _block_max(top, largest)
            if tid == 0:
                maxima[q] = top_value
            cuda.syncthreads()

    return kernel


@cuda.jit
def _code_parts(steps, parts, maxima, rows, decoded):
    tid = cuda.threadIdx.x
    top = cuda.shared.array(CODE_THREADS, np.float32)
    values = cuda.shared.array(256, np.float32)
    head = cuda.local.array(1, np.float32)
    scales = cuda.local.array(IN_FLIGHT, np.float32)
    for q in range(cuda.blockIdx.x, decoded.shape[0] * parts, cuda.gridDim.x):
        r, g = q // parts, q % parts
        largest = np.float32(0.0)
        for j in range(tid, parts, CODE_THREADS):
            largest = max(largest, maxima[r * parts + j])
        ref = _block_max(top, largest)
        _code_row(ref, steps, values, head, rows, decoded, r, g * CODE_THREADS + tid, parts * CODE_THREADS, g == 0,
                  scales)


def code_blocks(src, block, row_len, power, steps, rows, decoded, stream=0, empty=device_empty) -> None:
    """Block scales coded against each row's largest and framed, as the CPU kernel: ``spec.block_scales_from``
    of float64 sums of |x|^power (2 "l2", 1 "l1"; 0: the float32 scales in ``src``), then ``spec.code_scales``.

    A row of up to ``CODE_THREADS * CODE_SCALES_PER_THREAD`` scales is one block's, all rows in one launch:
    1. each thread writes its blocks' scales into ``decoded`` and keeps their largest; a tree
       in shared memory makes the row's largest, ref;
    2. the 256 values float32(float64(ref) * steps[k]) in shared memory; thread 0 writes ref's
       4 bytes at the row's head;
    3. each thread codes its blocks (``scalar.nearest_code``) behind the head and writes their
       decoded values over their scales.
    A longer row is split into ``parts`` blocks (at most ``CODE_THREADS``), in two launches:
    step 1 by each part, its largest into a temporary; then each part takes the row's largest
    from its parts' (the maximum of the same scales: the same ref) and does steps 2-3 on its
    own scales, the first part writing the head.
    """
    n, m = decoded.shape
    parts = min(CODE_THREADS, -(-m // (CODE_THREADS * CODE_SCALES_PER_THREAD)))
    if parts <= 1:
        launch(_code_blocks(power), grid_for(n, 1), CODE_THREADS, stream, src, block, row_len, steps, rows, decoded)
        return
    maxima = empty(n * parts, np.float32, stream)
    grid = grid_for(n * parts, 1)
    launch(_part_maxima(power), grid, CODE_THREADS, stream, src, block, row_len, parts, decoded, maxima)
    launch(_code_parts, grid, CODE_THREADS, stream, steps, parts, maxima, rows, decoded)


@cuda.jit
def _decode_codes(rows, steps, divisor, decoded):
    n, m = decoded.shape
    by = np.float32(divisor)
    head = cuda.local.array(SCALE_BYTES, np.uint8)
    r, first, ref = -1, -m, 0.0
    for t in range(cuda.grid(1), n * m, cuda.gridsize(1)):
        row, first = row_of(t, r, first, m)
        if row != r:
            r = row
            ref = row_ref(rows, r, head)
        decoded[r, t - first] = code_value(ref, rows, r, t - first, steps) / by


def decode_codes(rows, steps, divisor, decoded, stream=0) -> None:
    """decoded[r, b] = float32(float64(ref_r) * steps[code]) / float32(divisor) for the codes behind each wire
    row's head (its largest scale's 4 bytes), as the CPU kernel: one thread per block scale, which keeps the row of
    its last scale, and its head, and divides and reads a head only when it leaves it."""
    launch(_decode_codes, grid_for(decoded.shape[0] * decoded.shape[1]), THREADS, stream, rows, steps, divisor,
           decoded)
