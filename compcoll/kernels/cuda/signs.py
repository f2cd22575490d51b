"""The 1-bit codec's error-compensated encode and its decodes of signs by their rows' scales; the exact row average."""

from __future__ import annotations

import math
from functools import lru_cache

import numpy as np
from numba import cuda

from .. import scalar
from ..launch import launch
from .common import IN_FLIGHT, LOOKUPS, RAW_TYPES, THREADS, TILE, grid_for, pack, table_arg
from .records import scale_value as sum_scale

_SCALE_LOADS = {False: cuda.jit(device=True)(scalar.scale_value), True: cuda.jit(device=True)(scalar.scale_in_memory)}
"""The encode's scale, by whether it is in device memory (a one-element array) or a value."""


@lru_cache(maxsize=None)
def _encode_tiles(with_lut: bool):
    """The device function of the compensated encodes (``compensate_encode``, ``compensate_encode_agreed``): x = err
    + src, its signs packed into ``bits`` and err = x -+ ``scale``, a tile of ``TILE`` elements a block at a time."""
    look_up, raw_type = LOOKUPS[with_lut], RAW_TYPES[with_lut]

    @cuda.jit(device=True)
    def encode(src, lut, err, n_src, scale, bits):
        signs = cuda.shared.array(TILE, np.uint8)
        raw = cuda.local.array(8, raw_type)
        held = cuda.local.array(8, np.float32)
        lane = cuda.threadIdx.x
        n = err.size
        for tile in range(cuda.blockIdx.x, -(-bits.size // THREADS), cuda.gridDim.x):
            base = tile * TILE
            for j in range(8):
                i = base + j * THREADS + lane
                raw[j] = src[i] if i < n_src and i < n else 0
                held[j] = err[i] if i < n else np.float32(0)
            for j in range(8):
                if base + j * THREADS + lane < n_src:
                    held[j] = held[j] + look_up(lut, raw[j])
            for j in range(8):
                e = j * THREADS + lane
                i = base + e
                if i < n:
                    x = held[j]
                    if x >= 0:
                        signs[e] = 1
                        err[i] = x - scale
                    else:
                        signs[e] = 0
                        err[i] = x + scale
            cuda.syncthreads()
            k = tile * THREADS + lane
            if k < bits.size:
                bits[k] = pack(signs, 8 * lane)
            cuda.syncthreads()

    return encode


@lru_cache(maxsize=None)
def _compensate_encode(with_lut: bool, scale_in_memory: bool):
    encode = _encode_tiles(with_lut)
    read_scale = _SCALE_LOADS[scale_in_memory]

    @cuda.jit
    def kernel(src, lut, err, n_src, scale_slot, bits):
        encode(src, lut, err, n_src, read_scale(scale_slot), bits)

    return kernel


def compensate_encode(src, lut, err, n_src, scale, bits, stream=0) -> None:
    """x = err + src; bit = x >= 0; err = x -+ scale (float32), as the CPU kernel.

    ``scale`` is a number, or a one-element float32 device array that the kernel reads
    (a scale computed on the device: no host round trip). A block takes a tile of
    ``TILE`` elements: thread l reads and writes elements l, l + THREADS, ...
    (neighbouring threads, neighbouring elements: coalesced), its 8 elements' source and
    error all loaded before it stores any (an element's loads behind the previous one's store
    waited a round trip), keeps their signs in shared memory, then packs byte l of the tile
    from elements 8l..8l+7.
    """
    in_memory = not isinstance(scale, (int, float, np.number))
    launch(_compensate_encode(lut is not None, in_memory), grid_for(bits.size), THREADS, stream,
           src, table_arg(lut, stream), err, n_src, scale if in_memory else np.float32(scale), bits)


@lru_cache(maxsize=None)
def _compensate_encode_agreed(with_lut: bool):
    encode = _encode_tiles(with_lut)

    @cuda.jit
    def kernel(src, lut, err, n_src, table, first, step, me, senders, d, root_d, l2, divisor, weights, bits):
        encode(src, lut, err, n_src, sum_scale(table[first + me * step], d, root_d, l2), bits)
        i = cuda.grid(1)
        if i < weights.size:
            weights[i] = sum_scale(table[first + senders[i] * step], d, root_d, l2) / divisor

    return kernel


def compensate_encode_agreed(src, lut, err, n_src, table, first, step, me, senders, d, power, divisor, weights, bits,
                             stream=0) -> None:
    """``compensate_encode`` by rank ``me``'s scale of ``d`` elements from its float64 sum of |x|^power, and
    weights[i] <- rank senders[i]'s scale / ``divisor`` for every i < weights.size (``senders``: int32 ranks, as
    many), in one launch: the worker's encode and the server's weights from an agreement round's sums on the device
    (NCCL's), with no host value. Rank r's sum is table[first + r * step] (the sum fields of a gathered round's
    records, or a summed round's sums).

    1. Each thread derives rank ``me``'s scale from its sum (``records.scale_value``: ``spec.scale_from``'s IEEE
       steps), then encodes as ``compensate_encode``.
    2. Then thread i of the grid (a thread for every sender at least) writes weights[i]: rank senders[i]'s scale
       the same way, divided by ``divisor`` in float32 (``div.rn.f32``, as the host's ``codecs.divide_``). One
       sender a thread, after the encode: a grid-stride loop over the ranks took 64 registers (sm_90), the encode
       alone 40; so 40, and 56 for a 16-bit source (40 with its scale in memory).
    """
    grid = max(grid_for(bits.size), -(-weights.size // THREADS))
    launch(_compensate_encode_agreed(lut is not None), grid, THREADS, stream,
           src, table_arg(lut, stream), err, n_src, table, first, step, me, senders, d, math.sqrt(d), power == 2,
           np.float32(divisor), weights, bits)


@cuda.jit(device=True)
def _select_row(bits, r, first, count, high, low, out, lo):
    """out[lo + k] <- high where bit k of row r of ``bits`` (its bytes from column ``first``) is set, else low, for
    k < count.

    Each thread takes ``IN_FLIGHT`` elements a grid stride apart per round (neighbouring threads, neighbouring
    elements): it loads their ``IN_FLIGHT`` sign bytes first, then stores them.
    """
    step = cuda.gridsize(1)
    signs = cuda.local.array(IN_FLIGHT, np.uint8)
    for k in range(cuda.grid(1), count, IN_FLIGHT * step):
        for u in range(IN_FLIGHT):
            j = k + u * step
            signs[u] = bits[r, first + (j >> 3)] if j < count else 0
        for u in range(IN_FLIGHT):
            j = k + u * step
            if j < count:
                out[lo + j] = high if (signs[u] >> (7 - (j & 7))) & 1 else low


@cuda.jit
def _select_decode(bits, positive, negative, out, n_out):
    rows, row_bytes = bits.shape
    row_len = row_bytes * 8
    for r in range(rows):
        lo = r * row_len
        _select_row(bits, r, 0, min(lo + row_len, n_out) - lo, positive[r], negative[r], out, lo)


def select_decode(bits, positive, negative, out, n_out, stream=0) -> None:
    """out[i] = positive[r] if element i's bit is set, else negative[r] (row r of ``bits``), cut to n_out.

    Row by row, each thread taking ``IN_FLIGHT`` elements of the row a grid stride apart (``_select_row``), so that
    neighbouring threads write neighbouring elements and no thread divides to find its row; a thread for every
    ``IN_FLIGHT`` elements of a row (at most ``common.MAX_BLOCKS`` blocks), so that each has all its loads in flight
    at once.
    """
    launch(_select_decode, grid_for(min(n_out, bits.shape[1] * 8), IN_FLIGHT * THREADS), THREADS, stream, bits,
           positive, negative, out, n_out)


@cuda.jit
def _average_rows(rows, out):
    n, m = rows.shape
    divisor = np.float32(n)
    for i in range(cuda.grid(1), m, cuda.gridsize(1)):
        acc = rows[0, i]
        for r in range(1, n):
            acc += rows[r, i]
        out[i] = acc / divisor


def average_rows(rows, out, stream=0) -> None:
    """out[i] = (((rows[0, i] + rows[1, i]) + ...) + rows[n - 1, i]) / n in float32, as the CPU kernel.

    One thread per element (neighbouring threads read neighbouring elements of each row):
    1. add the rows in order in float32;
    2. divide by n (``div.rn.f32``: IEEE, as the CPU's division).
    """
    launch(_average_rows, grid_for(rows.shape[1]), THREADS, stream, rows, out)
