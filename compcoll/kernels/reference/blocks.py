"""The reference's block forms: a scale per block of elements, coded against each row's largest."""

from __future__ import annotations

import numpy as np

from ...spec import SCALES, block_lengths, block_scales_from, code_scales
from .signs import pack, sign, unpack


def block_sums(x: np.ndarray, block_size: int, power: int = 2, rows: int = 1) -> np.ndarray:
    """Float64 sums of |x|^power over the blocks of each of ``rows`` equal rows of ``x``, each summed sequentially.

    A row's blocks are ``block_size`` elements from its start, the last one shorter where
    needed (``spec.block_lengths``); row-major. Every |x| and square is exact in float64.
    """
    values = np.abs(np.asarray(x, dtype=np.float32).astype(np.float64)) ** power
    row_len = values.size // rows
    sums = []
    for row in values.reshape(rows, row_len):
        for start in range(0, row_len, block_size):
            block = row[start:start + block_size]
            sums.append(np.cumsum(block)[-1])
    return np.array(sums, dtype=np.float64)


def compress_blocks(x: np.ndarray, error: np.ndarray, block_size: int, scale: str = "l2", rows: int = 1
                    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``compress`` with one scale per block of ``block_size`` elements, sent as 8-bit codes per row.

    1. x = x + error (float32).
    2. s_b = ``block_scales_from(block_sums(x))`` for each block b of each of ``rows`` equal
       rows (wire rows: chunks; blocks restart at each row); q = sign(x).
    3. The scales of each row are coded against the row's largest (``code_scales``); s_b
       becomes its decoded value.
    4. new error = x - s_b * q on block b.

    Returns (packed bits, the decoded float32 block scales, new error).
    """
    x = (np.asarray(x, dtype=np.float32) + error).astype(np.float32)
    lengths = block_lengths(x.size // rows, block_size)
    exact = block_scales_from(block_sums(x, block_size, SCALES[scale], rows), np.tile(lengths, rows), scale)
    s = code_scales(exact.reshape(rows, -1))[2].reshape(-1)
    q = sign(x)
    return pack(q), s, (x - np.repeat(s, np.tile(lengths, rows)) * q).astype(np.float32)


def average_block_signs(bits: list[np.ndarray], scales: list[np.ndarray], count: int, block_size: int) -> np.ndarray:
    """``average_signs`` of one row of ``count`` elements with one scale per block (``spec.block_lengths``): term i
    of block b uses w_ib = float32(scales[i][b] / n)."""
    n = len(bits)
    lengths = block_lengths(count, block_size)
    acc = np.zeros(count, dtype=np.float32)
    for b, s in zip(bits, scales):
        w = np.repeat((np.asarray(s, np.float32) / np.float32(n)).astype(np.float32), lengths)
        acc = (acc + w * unpack(b, count)).astype(np.float32)
    return acc


def block_absmax(x: np.ndarray, block_size: int, rows: int = 1) -> np.ndarray:
    """Float32 max |x| over the blocks of each of ``rows`` equal rows (``block_sums``' blocks); NaN where a block holds
    NaN."""
    values = np.abs(np.asarray(x, dtype=np.float32))
    row_len = values.size // rows
    out = []
    for row in values.reshape(rows, row_len):
        for start in range(0, row_len, block_size):
            block = row[start:start + block_size]
            out.append(np.nan if np.isnan(block).any() else block.max())
    return np.array(out, dtype=np.float32)
