"""Per-element helpers that the kernel modules compile (Numba CPU and numba.cuda): input and scale loading, the scales' powers, the threshold hash."""

from __future__ import annotations

import numpy as np

from ..spec import GOLDEN, MIX1, MIX2, UNIFORM_BITS

_GOLDEN = np.uint64(GOLDEN)
_MIX1 = np.uint64(MIX1)
_MIX2 = np.uint64(MIX2)
_SHIFT = np.uint64(64 - UNIFORM_BITS)
_CELLS = float(1 << UNIFORM_BITS)


def load(src, lut, i):
    """Element i of an input as float32: itself (lut None) or its 16-bit pattern looked up in ``lut``."""
    if lut is None:
        return np.float32(src[i])
    return lut[src[i]]


def load_value(src, lut, i):
    """Element i of a float32 input (``lut`` unused: device kernels take no None arguments)."""
    return np.float32(src[i])


def load_table(src, lut, i):
    """Element i of a 16-bit input: its pattern looked up in the float32 table ``lut``."""
    return lut[src[i]]


def scale_value(scale):
    """A kernel's scale passed as a number."""
    return scale


def scale_in_memory(scale):
    """A kernel's scale passed as a one-element array (computed on the device)."""
    return scale[0]


def power(x, p):
    """|x|^p of a float64 for the scales' sums: x * x when p is 2, |x| when p is 1 (both exact)."""
    return x * x if p == 2 else abs(x)


def threshold(key, index):
    """Uniform threshold in (-1, 1) of element ``index`` of stream ``key`` (see ``reference.thresholds``).

    1. SplitMix64 of key + (index + 1) * golden ratio.
    2. Its top UNIFORM_BITS bits u give (2u + 1 - 2^bits) / 2^bits.
    """
    z = key + np.uint64(index + 1) * _GOLDEN
    z = (z ^ (z >> np.uint64(30))) * _MIX1
    z = (z ^ (z >> np.uint64(27))) * _MIX2
    z = z ^ (z >> np.uint64(31))
    return (np.float64(z >> _SHIFT) * 2.0 + 1.0 - _CELLS) / _CELLS
