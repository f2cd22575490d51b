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
def block_code(rows, r, b):
    """The code of block b in wire row r: the row's b-th byte behind its head."""
    return rows[r, SCALE_BYTES + b]


@cuda.jit(device=True)
def coded_scale(ref, steps, code):
    """The scale a block ``code`` stands for in a row of head ``ref`` (``row_ref``): float32(ref * steps[code])."""
    return np.float32(ref * steps[code])


@cuda.jit(device=True)
def code_value(ref, rows, r, b, steps):
    """Block b's scale in wire row r of head ``ref`` (``row_ref``): ``coded_scale`` of its ``block_code``."""
    return coded_scale(ref, steps, block_code(rows, r, b))


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
"""Words of a tiled decoder's shared array for one tile (``_stage_byte``): its ``TILE`` elements, one word of padding
after every 32."""
DECODE_ROUND = 8
"""Tiles a framed decoder's thread block decodes a round: each thread loads its byte of each (and their scales)
before it stages any, so a round waits for memory once, not once a tile."""
DECODE_WORDS = DECODE_ROUND * DECODE_TILE
"""Words of a framed decoder's shared array: a round's tiles (numba sizes a shared array by one constant)."""


@cuda.jit(device=True)
def _stage_byte(staged, at, byte, high, low):
    """The thread's 8 elements of a tile from its sign byte: high where the bit is set, else low, into ``staged``
    from word ``at`` (the tile's), at 8 x its index (the first element in the most significant bit). With a word of
    padding after every 32, the 32 threads of a warp write 32 different banks."""
    for u in range(8):
        e = 8 * cuda.threadIdx.x + u
        staged[at + e + (e >> 5)] = high if (byte >> (7 - u)) & 1 else low


@cuda.jit(device=True)
def _store_tile(staged, at, out, base, n_out):
    """out[base + e] <- the tile staged from word ``at``'s element e, for e < ``TILE`` and base + e < n_out:
    neighbouring threads on neighbouring elements (coalesced)."""
    for j in range(8):
        e = j * THREADS + cuda.threadIdx.x
        if base + e < n_out:
            out[base + e] = staged[at + e + (e >> 5)]


@lru_cache(maxsize=None)
def _decode_framed(dtype: str, blocks: bool):
    """The tiled decoder of wire rows into a ``dtype`` output's raw bits: one scale a row (its head), or with
    ``blocks`` a scale a block (the head times the block's code's step; ``per_row`` codes behind the head, a block
    2^``shift`` elements).

    A thread block takes ``DECODE_ROUND`` tiles (``TILE`` elements, a byte a thread each) a round:
    1. each thread loads its byte of every tile (and the row's head, read where the thread's row changes; with
       ``blocks`` the byte's block code), all before it uses any;
    2. then the value each byte's 8 elements take (with ``blocks`` its code's step: a second load, which waited
       behind the first where each tile's value came before the next tile's loads);
    3. it stages each byte's 8 elements (``_stage_byte``);
    4. after a barrier the block stores the round's tiles coalesced (``_store_tile``), then waits at a barrier
       before the next round stages over them.
    A round inside one row (in a row of many rounds, all but the two at its ends) takes the row and head of its
    first byte and loads its bytes at constant offsets, with no bounds check or row walk; another checks and walks
    each byte (until 2026-12-05 every round did: 96-108 registers, 72-82 now).
    """
    rounded, sign = _ROUNDINGS[dtype]
    flip = np.uint32(sign)

    @cuda.jit
    def kernel(rows, steps, per_row, shift, out, n_out):
        staged = cuda.shared.array(DECODE_WORDS, np.uint32)
        head = cuda.local.array(SCALE_BYTES, np.uint8)
        value = cuda.local.array(1, np.float32)
        held = cuda.local.array(DECODE_ROUND, np.uint8)
        codes = cuda.local.array(DECODE_ROUND, np.uint8)
        refs = cuda.local.array(DECODE_ROUND, np.float32)
        highs = cuda.local.array(DECODE_ROUND, np.uint32)
        row_bytes = rows.shape[1] - SCALE_BYTES - per_row
        signs = SCALE_BYTES + per_row
        total = min(rows.shape[0] * row_bytes, (n_out + 7) // 8)
        tiles = (total + THREADS - 1) // THREADS
        r, first, ref = -1, -row_bytes, 0.0
        for tile in range(cuda.blockIdx.x * DECODE_ROUND, tiles, cuda.gridDim.x * DECODE_ROUND):
            row, first = row_of(tile * THREADS, r, first, row_bytes)
            if row != r:
                r = row
                ref = row_ref(rows, r, head)
            if (tile + DECODE_ROUND) * THREADS <= min(total, first + row_bytes):
                c = tile * THREADS + cuda.threadIdx.x - first
                mine = rows[r, signs + c:]
                for u in range(DECODE_ROUND):
                    held[u] = mine[u * THREADS]
                    codes[u] = block_code(rows, r, (8 * (c + u * THREADS)) >> shift) if blocks else 0
                    refs[u] = np.float32(ref)
            else:
                for u in range(DECODE_ROUND):
                    t = (tile + u) * THREADS + cuda.threadIdx.x
                    held[u] = 0
                    codes[u] = 0
                    if t < total:
                        row, first = row_of(t, r, first, row_bytes)
                        if row != r:
                            r = row
                            ref = row_ref(rows, r, head)
                        c = t - first
                        held[u] = rows[r, signs + c]
                        if blocks:
                            codes[u] = block_code(rows, r, (8 * c) >> shift)
                    refs[u] = np.float32(ref)
            for u in range(DECODE_ROUND):
                value[0] = coded_scale(np.float64(refs[u]), steps, codes[u]) if blocks else refs[u]
                highs[u] = rounded(np.int64(value.view(np.uint32)[0]))
            for u in range(DECODE_ROUND):
                if (tile + u) * THREADS + cuda.threadIdx.x < total:
                    _stage_byte(staged, u * DECODE_TILE, held[u], highs[u], highs[u] ^ flip)
            cuda.syncthreads()
            for u in range(DECODE_ROUND):
                _store_tile(staged, u * DECODE_TILE, out, (tile + u) * TILE, n_out)
            cuda.syncthreads()

    return kernel


def decode_framed(rows, out, n_out, dtype: str, stream=0) -> None:
    """out[i] = +s_r if element i's bit is set, else -s_r, cut to n_out, where s_r is the float32 scale at the
    head of wire row r (``SCALE_BYTES`` little-endian bytes, then the packed signs), rounded to ``dtype``:
    ``signs.select_decode`` reading its scales from the frames, so nothing reads, rounds, negates or copies them first.

    ``out`` is the raw view of a ``dtype`` output (float32: uint32, 16-bit: uint16).
    Tiled over the rows' sign bytes, ``TILE`` elements (``THREADS`` bytes) a tile, ``DECODE_ROUND`` tiles a round
    of a thread block (``_decode_framed``):
    1. Each thread takes one byte a tile: the row's head bytes make the scale's float32 bits (read when the thread's
       row changes); ``dtype``'s rounding (float16, bfloat16: to nearest even, as torch's) makes +s_r, and its sign
       bit flipped -s_r (what rounding the negated float32 gives); the byte's 8 elements go to shared memory
       (``_stage_byte``).
    2. The tiles' elements are stored coalesced (``_store_tile``).
    One byte load serves 8 elements, and a round's stores wait only for its loads.
    """
    launch(_decode_framed(dtype, False), _decode_grid(rows.shape[0] * (rows.shape[1] - SCALE_BYTES), n_out), THREADS,
           stream, rows, stand_in(device_of(stream), np.float64), 0, 0, out, n_out)


def _decode_grid(sign_bytes: int, n_out: int) -> int:
    """Blocks of a framed decoder over its rows' ``sign_bytes``, cut to ``n_out`` elements: a round of
    ``DECODE_ROUND`` tiles a block (at most ``common.MAX_BLOCKS``)."""
    return grid_for(min(sign_bytes, -(-n_out // 8)), THREADS * DECODE_ROUND)


def decode_framed_blocks(rows, steps, per_row, block, out, n_out, dtype: str, stream=0) -> None:
    """out[i] = +-s for element k of row r, cut to n_out, where s = float32(float64(ref_r) * steps[code]) from its
    block's code behind the row's head (its largest scale's 4 bytes), rounded to ``dtype`` (as ``decode_framed``),
    and its sign behind the codes: the block scales' decode and the elements' in one launch, tiled as
    ``decode_framed``: a thread takes a sign byte, whose 8 elements share a block (a block size is a power of two
    from 8), so one code and its step make their value (a thread keeps the row of its last byte, and its head, and
    divides and reads a head only when it leaves it; k // block a shift).
    ``out`` is the raw view of a ``dtype`` output (float32: uint32, 16-bit: uint16)."""
    launch(_decode_framed(dtype, True), _decode_grid(rows.shape[0] * (rows.shape[1] - SCALE_BYTES - per_row), n_out),
           THREADS, stream, rows, steps, per_row, shift_of(block), out, n_out)
