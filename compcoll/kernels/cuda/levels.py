"""The level codec's kernels: ``nbits`` levels an element by its block's step, encoded, accumulated, decoded."""

from __future__ import annotations

import math
from functools import lru_cache

import numpy as np
from numba import cuda

from ..launch import launch
from .blocks import rank_accumulator, tiled_block_encoder, unread_steps
from .common import IN_FLIGHT, LOOKUPS, RAW_TYPES, THREADS, grid_for, row_of, shift_of, table_arg


@cuda.jit(device=True)
def _level_code(x, step, nbits):
    """``nbits`` levels, as the CPU kernel: c = floor(float32(x / step) + 2^(nbits - 1)) clamped to [0, 2^nbits - 1]
    (0 where step is 0), and x - float32((c - (2^nbits - 1) / 2) * step) in float64."""
    top = np.float64((1 << nbits) - 1)
    q = np.float32(x / step) if step > 0 else np.float32(0)
    c = min(max(math.floor(np.float32(q + np.float32(1 << (nbits - 1)))), 0.0), top)
    return np.uint8(c), x - np.float32(np.float64(c - top / 2.0) * np.float64(step))


@lru_cache(maxsize=None)
def _encode_levels(with_lut: bool):
    return tiled_block_encoder(LOOKUPS[with_lut], RAW_TYPES[with_lut], _level_code, False)


def encode_levels(src, lut, err, n_src, steps, block, nbits, planes, stream=0) -> None:
    """The CPU kernel's levels, errors and bit planes: ``tiled_block_encoder`` with ``nbits`` planes."""
    launch(_encode_levels(lut is not None), grid_for(planes.shape[0] * (planes.shape[1] // nbits)), THREADS, stream,
           src, table_arg(lut, stream), err, n_src, steps, shift_of(block), nbits, planes)


@cuda.jit(device=True)
def _level_of(planes, r, row_bytes, k, nbits):
    """The level of element k of row r of bit planes (``encode_levels``' layout): bit j from plane j."""
    code = 0
    for j in range(nbits):
        code |= ((planes[r, j * row_bytes + (k >> 3)] >> (7 - (k & 7))) & 1) << j
    return code


@cuda.jit(device=True)
def _add_level(acc, code, w, i, nbits):
    """acc + float32((code - (2^nbits - 1) / 2) * float64(w)): the centred level times its weight, in float32."""
    return acc + np.float32((code - ((1 << nbits) - 1) / 2.0) * np.float64(w))


_accumulate_levels = {source: rank_accumulator(_level_of, _add_level, False, source) for source in ("table", "codes")}
"""out[i] = sum over ranks r of float32(level_r(i) * w[r, i >> shift]), in r order in float32:
``blocks.rank_accumulator`` of levels, by where the weights come from (a table, or the wire rows' codes)."""


def accumulate_levels(planes, weights, block, nbits, out, n_out, stream=0) -> None:
    """out = sum_r float32(level_r * weights[r, i // block]) rank by rank in float32, as the CPU kernel:
    ``IN_FLIGHT`` elements a thread (i // block a shift), a thread for every ``IN_FLIGHT`` elements."""
    launch(_accumulate_levels["table"], grid_for(n_out, IN_FLIGHT * THREADS), THREADS, stream, planes, weights,
           unread_steps(stream), 1, shift_of(block), nbits, out, out, n_out)


def accumulate_framed_levels(planes, rows, steps, divisor, block, nbits, out, n_out, stream=0) -> None:
    """``accumulate_levels`` with the weights decoded from the wire ``rows`` (their heads and step codes, divided by
    ``divisor``) in the same launch: the CPU kernels' ``decode_codes`` then ``accumulate_levels``, in one."""
    launch(_accumulate_levels["codes"], grid_for(n_out, IN_FLIGHT * THREADS), THREADS, stream, planes, rows, steps,
           divisor, shift_of(block), nbits, out, out, n_out)


@cuda.jit
def _decode_levels(planes, steps, shift, nbits, out, n_out):
    """out[i] = float32(level(i) * steps[r, k >> shift]) for element k of row r: each thread takes ``IN_FLIGHT``
    elements a grid stride apart a round, walks their rows and loads their plane bytes and steps, then stores."""
    row_bytes = planes.shape[1] // nbits
    row_len = row_bytes * 8
    half = ((1 << nbits) - 1) / 2.0
    step = cuda.gridsize(1)
    codes = cuda.local.array(IN_FLIGHT, np.int32)
    scales = cuda.local.array(IN_FLIGHT, np.float32)
    r, first = -1, -row_len
    for k in range(cuda.grid(1), n_out, IN_FLIGHT * step):
        for u in range(IN_FLIGHT):
            i = k + u * step
            if i < n_out:
                r, first = row_of(i, r, first, row_len)
                codes[u] = _level_of(planes, r, row_bytes, i - first, nbits)
                scales[u] = steps[r, (i - first) >> shift]
        for u in range(IN_FLIGHT):
            i = k + u * step
            if i < n_out:
                out[i] = np.float32(0) + np.float32((codes[u] - half) * np.float64(scales[u]))


def decode_levels(planes, steps, block, nbits, out, n_out, stream=0) -> None:
    """Row r's levels into out[r * row_len:], as the CPU kernel: ``IN_FLIGHT`` elements a thread (their rows kept,
    ``row_of``; k // block a shift)."""
    launch(_decode_levels, grid_for(n_out, IN_FLIGHT * THREADS), THREADS, stream, planes, steps, shift_of(block),
           nbits, out, n_out)
