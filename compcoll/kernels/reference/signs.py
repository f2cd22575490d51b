"""The reference's 1-bit codec: signs, packing, one compensated compression, decoded signs' average."""

from __future__ import annotations

import numpy as np

from .sums import scale_of


def sign(x: np.ndarray) -> np.ndarray:
    """Sign as float32 with sign(0) = +1 (also for -0.0)."""
    return np.where(x >= 0, np.float32(1), np.float32(-1)).astype(np.float32)


def pack(q: np.ndarray) -> np.ndarray:
    """Pack signs into bytes, first element in the most significant bit (np.packbits order)."""
    return np.packbits(q > 0)


def unpack(bits: np.ndarray, count: int) -> np.ndarray:
    """Inverse of ``pack``: the first ``count`` signs as float32 +-1."""
    return np.unpackbits(bits)[:count].astype(np.float32) * 2 - 1


def pad(x: np.ndarray, length: int) -> np.ndarray:
    """``x`` as float32, zero-padded to ``length`` elements."""
    padded = np.zeros(length, dtype=np.float32)
    padded[: x.size] = x
    return padded


def compress(x: np.ndarray, error: np.ndarray, scale: str = "l2") -> tuple[np.ndarray, np.float32, np.ndarray]:
    """One error-compensated 1-bit compression.

    1. x = x + error (float32).
    2. s = ``scale_of(x, len(x), scale)``; q = sign(x).
    3. new error = x - s * q.

    Returns (packed bits, s, new error).
    """
    x = (np.asarray(x, dtype=np.float32) + error).astype(np.float32)
    s = scale_of(x, x.size, scale)
    q = sign(x)
    return pack(q), s, (x - s * q).astype(np.float32)


def average_signs(bits: list[np.ndarray], scales: list[np.float32], count: int) -> np.ndarray:
    """(1/n) * sum_i scales[i] * unpack(bits[i]), summed in rank order in float32.

    Each term uses the weight w_i = float32(scales[i] / n).
    """
    n = len(bits)
    acc = np.zeros(count, dtype=np.float32)
    for b, s in zip(bits, scales):
        w = np.float32(np.float32(s) / np.float32(n))
        acc = (acc + w * unpack(b, count)).astype(np.float32)
    return acc
