"""The reference's sums in the library's fixed order, the exact average of rows, and the 1-bit scales.

The order: blocks of ``BLOCK``, ``LANES`` lanes, a pairwise tree.
"""

from __future__ import annotations

import numpy as np

from ...spec import BLOCK, LANES, SCALES, scale_from


def tree_sum(values: np.ndarray) -> float:
    """Add values by a fixed pairwise tree.

    1. Pad with zeros to the next power of two.
    2. Repeatedly replace v by v[:half] + v[half:] until one value is left.
    """
    v = np.asarray(values, dtype=np.float64)
    size = 1
    while size < v.size:
        size *= 2
    v = np.concatenate([v, np.zeros(size - v.size)])
    while v.size > 1:
        half = v.size // 2
        v = v[:half] + v[half:]
    return float(v[0])


def average_rows(rows: np.ndarray) -> np.ndarray:
    """The float32 average of the rows of an (n, m) array: summed in row order, each sum rounded to float32, then
    divided by n (IEEE float32 division): what every rank computes alike for an exact average."""
    acc = rows[0].astype(np.float32)
    for row in rows[1:]:
        acc = (acc + row).astype(np.float32)
    return (acc / np.float32(len(rows))).astype(np.float32)


def power_sum(x: np.ndarray, power: int = 2) -> float:
    """Sum of |x|^power (power 1 or 2) of a float32 vector in the library's fixed order.

    1. Take every |x| (power 1) or square (power 2) exactly in float64 and pad with zeros to whole blocks.
    2. Sum each (block, lane) sequentially (np.cumsum is sequential by definition).
    3. Combine the block-major lane sums with ``tree_sum``.
    """
    values = np.abs(np.asarray(x, dtype=np.float32).astype(np.float64)) ** power
    nblocks = max(1, -(-values.size // BLOCK))
    padded = np.zeros(nblocks * BLOCK)
    padded[: values.size] = values
    lanes = np.cumsum(padded.reshape(nblocks, BLOCK // LANES, LANES), axis=1)[:, -1, :]
    return tree_sum(lanes.reshape(-1))


def sumsq(x: np.ndarray) -> float:
    """Sum of squares of a float32 vector in the library's fixed order (``power_sum`` with power 2)."""
    return power_sum(x, 2)


def segment_sumsq(x: np.ndarray, bounds: np.ndarray) -> np.ndarray:
    """Every segment's ``sumsq``: element j is that of x[bounds[j]:bounds[j + 1]], each in its own fixed order
    (an empty segment's is 0)."""
    return np.array([sumsq(x[lo:hi]) for lo, hi in zip(bounds[:-1], bounds[1:])], dtype=np.float64)


def scale_of(x: np.ndarray, d: int, scale: str = "l2") -> np.float32:
    """The 1-bit scale of ``x`` over d elements: "l2" ``||x||_2 / sqrt(d)`` (DeepSpeed's) or "l1" ``||x||_1 / d``."""
    return scale_from(power_sum(x, SCALES[scale]), d, scale)
