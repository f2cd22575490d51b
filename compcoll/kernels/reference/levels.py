"""The reference's level codec: uniform levels of a step per block, packed as bit planes."""

from __future__ import annotations

import numpy as np

from ...spec import code_scales, level_step
from .blocks import block_absmax
from .signs import pack


def level_codes(x: np.ndarray, steps: np.ndarray, bits: int) -> tuple[np.ndarray, np.ndarray]:
    """The ``bits``-bit level of each element of float32 ``x`` given its block's step, and its float32 value.

    1. t = float32(x / step) (0 where step is 0); c = clip(floor(float32(t + 2^(bits-1))), 0, 2^bits - 1).
    2. d = c - (2^bits - 1) / 2 (exact); value = float32(float64(d) * float64(step)) (the product exact, one
       rounding).
    """
    x = np.asarray(x, dtype=np.float32)
    steps = np.asarray(steps, dtype=np.float32)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        t = np.where(steps > 0, (x / np.where(steps > 0, steps, np.float32(1))).astype(np.float32), np.float32(0))
    top = (1 << bits) - 1
    c = np.clip(np.floor((t + np.float32(1 << (bits - 1))).astype(np.float32)), 0, top).astype(np.int64)
    d = c.astype(np.float64) - top / 2.0
    return c.astype(np.uint8), (d * steps.astype(np.float64)).astype(np.float32)


def pack_planes(codes: np.ndarray, bits: int, rows: int) -> np.ndarray:
    """(rows, bits * row_len / 8) bytes: for each row, plane j (bit j of every code, j = 0 first) packed as signs
    are."""
    table = codes.reshape(rows, -1)
    return np.concatenate([np.stack([pack(((row >> j) & 1).astype(np.float32) * 2 - 1) for j in range(bits)])
                           .reshape(-1)[None] for row in table])


def unpack_planes(planes: np.ndarray, bits: int, count: int) -> np.ndarray:
    """The first ``count`` codes of one row's planes (inverse of ``pack_planes``)."""
    per_plane = planes.size // bits
    codes = np.zeros(count, dtype=np.int64)
    for j in range(bits):
        codes |= (np.unpackbits(planes[j * per_plane:(j + 1) * per_plane])[:count].astype(np.int64) << j)
    return codes


def compress_levels(x: np.ndarray, error: np.ndarray, block_size: int, bits: int, rows: int = 1
                    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One error-compensated compression to ``bits``-bit uniform levels, one step per block.

    1. x = x + error (float32).
    2. step_b = ``level_step`` of block b's max |x|; the steps of each row coded against the row's
       largest (``code_scales``); step_b becomes its decoded value.
    3. Each element's level and value (``level_codes``); new error = x - value.

    Returns ((rows, bits * row_len / 8) planes, the decoded float32 steps, new error).
    """
    x = (np.asarray(x, dtype=np.float32) + error).astype(np.float32)
    row_len = x.size // rows
    steps = code_scales(level_step(block_absmax(x, block_size, rows), bits).reshape(rows, -1))[2].reshape(-1)
    per_element = np.repeat(steps.reshape(rows, -1), block_size, axis=1)[:, :row_len].reshape(-1)
    codes, values = level_codes(x, per_element, bits)
    return pack_planes(codes, bits, rows), steps, (x - values).astype(np.float32)
