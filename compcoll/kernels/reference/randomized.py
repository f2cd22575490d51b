"""The reference's binary randomization (Birder's): thresholds, a row's largest |z|, the bits.

Each element's uniform threshold, a row's largest |z|, and the randomized bits.
"""

from __future__ import annotations

import numpy as np

from ...spec import GOLDEN, UNIFORM_BITS, mix64


def thresholds(key: int, start: int, count: int) -> np.ndarray:
    """The uniform thresholds of elements start .. start+count-1 of a stream, in (-1, 1).

    1. u = mix64(key + (index + 1) * GOLDEN) >> 40 (the top 24 bits), modulo 2^64.
    2. r = (2u + 1 - 2^24) / 2^24: the midpoints of 2^24 equal cells of (-1, 1), exact in float64.
    """
    index = np.arange(start + 1, start + count + 1, dtype=np.uint64)
    u = mix64(np.uint64(key) + index * np.uint64(GOLDEN)) >> np.uint64(64 - UNIFORM_BITS)
    cells = float(1 << UNIFORM_BITS)
    return (u.astype(np.float64) * 2 + 1 - cells) / cells


def absmax_rows(x: np.ndarray, rows: int) -> np.ndarray:
    """max |x| over each of ``rows`` equal rows of a float32 vector (NaN if a row holds one)."""
    return np.abs(np.asarray(x, dtype=np.float32)).reshape(rows, -1).max(axis=1)


def binarize(z: np.ndarray, scales: np.ndarray, key: int, start: int) -> np.ndarray:
    """Birder's binary randomization (docs/architecture.md, "Exact numerics"), one scale per row, packed per row.

    Element i of row r, with s = scales[r] >= |z_i| and threshold t_i of index start + i:
    1. bit_i = z_i > t_i * s (in float64, where t_i * s is exact), so that
       P(bit_i) = (1 + z_i / s) / 2 up to the 2^-24 grid of t.
    2. The decode s * (2 bit_i - 1) is then an unbiased estimate of z_i.

    Returns the (rows, row_length / 8) packed bits.
    """
    rows = len(scales)
    z64 = np.asarray(z, dtype=np.float32).astype(np.float64).reshape(rows, -1)
    t = thresholds(key, start, z64.size).reshape(rows, -1)
    bits = z64 > t * np.asarray(scales, dtype=np.float32).astype(np.float64)[:, None]
    return np.packbits(bits, axis=1)


def randomized_rows(z: np.ndarray, rows: int, key: int, start: int) -> tuple[np.ndarray, np.ndarray]:
    """(per-row max scales, packed rows) of ``z`` split into ``rows`` rows."""
    scales = absmax_rows(z, rows)
    return scales, binarize(z, scales, key, start)
