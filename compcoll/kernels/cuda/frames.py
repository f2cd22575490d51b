"""The wire frames on the device: a row's head scale written and read, and the tiled decoders of framed rows.

A wire row is ``SCALE_BYTES`` little-endian bytes of its float32 scale (the head), then, for the block forms, one
code a block, then the packed signs (``spec``). The framed decoders are tiled the other way from the encoders: a
thread unpacks one byte into shared memory, then the tile is stored coalesced.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np
from numba import cuda

from .. import scalar
from ...spec import SCALE_BYTES
from ..launch import device_of, launch
from .common import THREADS, TILE, grid_for, row_of, shift_of, stand_in


@cuda.jit(device=True)
def write_head(rows, r, value, head):
    """The ``SCALE_BYTES`` bytes at the head of wire row r <- float32 ``value``'s, through ``head`` (a one-element
    float32 local array) and its ``.view``: ``read_head``'s inverse."""
    head[0] = value
    raw = head.view(np.uint8)
    for j in range(SCALE_BYTES):
        rows[r, j] = raw[j]


@cuda.jit(device=True)
def read_head(rows, r, head):
    """head (a local array) <- the ``SCALE_BYTES`` bytes at the head of wire row r: read as a float32, or its bits as
    a uint32, through ``head.view`` (a bit cast the simulator runs too)."""
    for j in range(SCALE_BYTES):
        head[j] = rows[r, j]


@cuda.jit(device=True)
def row_ref(rows, r, head):
    """float64(ref_r), ref_r the float32 at the head of wire row r (read through ``head``, a local array)."""
    read_head(rows, r, head)
    return np.float64(head.view(np.float32)[0])


@cuda.jit(device=True)
def code_value(ref, rows, r, b, steps):
    """Block b's scale in wire row r of head ``ref`` (``row_ref``): float32(ref * steps[code_b]), code_b the row's
    b-th byte behind its head."""
    return np.float32(ref * steps[rows[r, SCALE_BYTES + b]])


@cuda.jit
def _head_weights(rows, divisor, out):
    by = np.float32(divisor)
    head = cuda.local.array(SCALE_BYTES, np.uint8)
    for r in range(cuda.grid(1), out.size, cuda.gridsize(1)):
        read_head(rows, r, head)
        out[r] = head.view(np.float32)[0] / by


def head_weights(rows, divisor, out, stream=0) -> None:
    """out[r] = s_r / float32(divisor), s_r the float32 scale at the head of wire row r (IEEE float32 division, as
    ``codecs.divide_``): a frame's scales as the weights s / n in one launch, not a copy and a division by torch."""
    launch(_head_weights, grid_for(out.size), THREADS, stream, rows, divisor, out)


_ROUNDINGS = {"float32": (cuda.jit(device=True)(scalar.same_bits), np.int64(1 << 31)),
              "float16": (cuda.jit(device=True)(scalar.half_bits), np.int64(1 << 15)),
              "bfloat16": (cuda.jit(device=True)(scalar.bfloat16_bits), np.int64(1 << 15))}
"""Per output dtype of ``decode_framed``: a float32's bits to the output's (rounded to nearest even), and its sign
bit."""

DECODE_TILE = TILE + TILE // 32
"""Words of a tiled decoder's shared array (``_stage_byte``): a tile's ``TILE`` elements, one word of padding after
every 32."""


@cuda.jit(device=True)
def _stage_byte(staged, byte, high, low):
    """The thread's 8 elements of the tile from its sign byte: high where the bit is set, else low, into ``staged``
    at 8 x its index (the first element in the most significant bit). With a word of padding after every 32, the 32
    threads of a warp write 32 different banks."""
    for u in range(8):
        e = 8 * cuda.threadIdx.x + u
        staged[e + (e >> 5)] = high if (byte >> (7 - u)) & 1 else low


@cuda.jit(device=True)
def _store_tile(staged, out, base, n_out):
    """out[base + e] <- the tile's staged element e, for e < ``TILE`` and base + e < n_out: neighbouring threads on
    neighbouring elements (coalesced), between the barriers that order them after the staging and before the next."""
    cuda.syncthreads()
    for j in range(8):
        e = j * THREADS + cuda.threadIdx.x
        if base + e < n_out:
            out[base + e] = staged[e + (e >> 5)]
    cuda.syncthreads()


@lru_cache(maxsize=None)
def _decode_framed(dtype: str, blocks: bool):
    """The tiled decoder of wire rows into a ``dtype`` output's raw bits: one scale a row (its head), or with
    ``blocks`` a scale a block (the head times the block's code's step; ``per_row`` codes behind the head, a block
    2^``shift`` elements)."""
    rounded, sign = _ROUNDINGS[dtype]

    @cuda.jit
    def kernel(rows, steps, per_row, shift, out, n_out):
        staged = cuda.shared.array(DECODE_TILE, np.uint32)
        head = cuda.local.array(SCALE_BYTES, np.uint8)
        value = cuda.local.array(1, np.float32)
        row_bytes = rows.shape[1] - SCALE_BYTES - per_row
        signs = SCALE_BYTES + per_row
        total = min(rows.shape[0] * row_bytes, (n_out + 7) // 8)
        r, first, ref = -1, -row_bytes, 0.0
        for tile in range(cuda.blockIdx.x, (total + THREADS - 1) // THREADS, cuda.gridDim.x):
            t = tile * THREADS + cuda.threadIdx.x
            if t < total:
                row, first = row_of(t, r, first, row_bytes)
                if row != r:
                    r = row
                    ref = row_ref(rows, r, head)
                c = t - first
                value[0] = code_value(ref, rows, r, (8 * c) >> shift, steps) if blocks else np.float32(ref)
                high = rounded(np.int64(value.view(np.uint32)[0]))
                _stage_byte(staged, rows[r, signs + c], high, high ^ sign)
            _store_tile(staged, out, tile * TILE, n_out)

    return kernel


def decode_framed(rows, out, n_out, dtype: str, stream=0) -> None:
    """out[i] = +s_r if element i's bit is set, else -s_r, cut to n_out, where s_r is the float32 scale at the
    head of wire row r (``SCALE_BYTES`` little-endian bytes, then the packed signs), rounded to ``dtype``:
    ``signs.select_decode`` reading its scales from the frames, so nothing reads, rounds, negates or copies them first.

    ``out`` is the raw view of a ``dtype`` output (float32: uint32, 16-bit: uint16).
    Tiled over the rows' sign bytes, ``TILE`` elements (``THREADS`` bytes) a tile:
    1. Each thread takes one byte: the row's head bytes make the scale's float32 bits (read when the thread's row
       changes); ``dtype``'s rounding (float16, bfloat16: to nearest even, as torch's) makes +s_r, and its sign bit
       flipped -s_r (what rounding the negated float32 gives); the byte's 8 elements go to shared memory
       (``_stage_byte``).
    2. The tile's elements are stored coalesced (``_store_tile``).
    One byte load serves 8 elements, and the stores wait only for the tile's loads.
    """
    launch(_decode_framed(dtype, False), grid_for(min(rows.shape[0] * (rows.shape[1] - SCALE_BYTES), -(-n_out // 8))),
           THREADS, stream, rows, stand_in(device_of(stream), np.float64), 0, 0, out, n_out)


def decode_framed_blocks(rows, steps, per_row, block, out, n_out, dtype: str, stream=0) -> None:
    """out[i] = +-s for element k of row r, cut to n_out, where s = float32(float64(ref_r) * steps[code]) from its
    block's code behind the row's head (its largest scale's 4 bytes), rounded to ``dtype`` (as ``decode_framed``),
    and its sign behind the codes: the block scales' decode and the elements' in one launch, tiled as
    ``decode_framed``: a thread takes a sign byte, whose 8 elements share a block (a block size is a power of two
    from 8), so one code and its step make their value (a thread keeps the row of its last byte, and its head, and
    divides and reads a head only when it leaves it; k // block a shift).
    ``out`` is the raw view of a ``dtype`` output (float32: uint32, 16-bit: uint16)."""
    tiles = grid_for(min(rows.shape[0] * (rows.shape[1] - SCALE_BYTES - per_row), -(-n_out // 8)))
    launch(_decode_framed(dtype, True), tiles, THREADS, stream, rows, steps, per_row, shift_of(block), out, n_out)
