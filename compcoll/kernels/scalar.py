"""Per-element helpers the kernel modules compile (Numba CPU and numba.cuda): loads, the scales' powers, the hash."""

from __future__ import annotations

import math

import numpy as np

from ..spec import GOLDEN, LEVEL_FACTORS, MIX1, MIX2, UNIFORM_BITS

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


def larger_or_nan(m, a):
    """``a`` where it is larger than ``m`` or NaN, else ``m``: a step of a maximum that keeps a NaN it meets (the row
    maxima's, where a NaN row must stay NaN)."""
    return a if a > m or a != a else m


def value_of(lut, raw):
    """A float32 input's element, as loaded (``lut`` unused: device kernels take no None arguments)."""
    return np.float32(raw)


def table_value(lut, raw):
    """A 16-bit input's element: its loaded pattern looked up in the float32 table ``lut``."""
    return lut[raw]


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


def same_bits(bits):
    """A float32's bits, kept (the float32 output of ``decode_framed``)."""
    return bits


def bfloat16_bits(bits):
    """The bfloat16 nearest a float32, ties to even, from its bits (int64 in, int64 out): torch's rounding.

    1. NaN: the quiet NaN 0x7FC0.
    2. Otherwise add 0x7FFF, plus 1 when bit 16 (the lowest kept) is set, and keep the top 16 bits:
       a carry out of the mantissa raises the exponent (to infinity past the largest finite).
    """
    if (bits & 0x7FFFFFFF) > 0x7F800000:
        return np.int64(0x7FC0)
    return (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16


def half_bits(bits):
    """The float16 nearest a float32, ties to even, from its bits (int64 in, int64 out): IEEE's rounding, torch's.

    1. Infinity stays infinite, NaN becomes the quiet NaN 0x7E00; from 65520 (halfway past 65504,
       float16's largest) on, infinity.
    2. Below 2^-14 (float16's smallest normal): the subnormal of m * 2^(e - 150) in units of 2^-24,
       m >> (126 - e) rounded to nearest even on the bits shifted out; below 2^-25, zero.
    3. Otherwise rebias the exponent (127 -> 15) and drop 13 mantissa bits, rounded to nearest
       even (a carry raises the exponent).
    The sign is kept throughout.
    """
    sign = (bits >> 16) & 0x8000
    a = bits & 0x7FFFFFFF
    if a > 0x7F800000:
        return sign | 0x7E00
    if a >= 0x477FF000:
        return sign | 0x7C00
    if a < 0x33000000:
        return sign
    if a < 0x38800000:
        shift = 126 - (a >> 23)
        m = (a & 0x7FFFFF) | 0x800000
        rest = m & ((np.int64(1) << shift) - 1)
        halfway = np.int64(1) << (shift - 1)
        h = m >> shift
    else:
        rest = a & 0x1FFF
        halfway = np.int64(0x1000)
        h = (a - 0x38000000) >> 13
    if rest > halfway or (rest == halfway and (h & 1) == 1):
        h += 1
    return sign | h


def block_scale(src, i, d, power):
    """Scale i of a coding kernel's input: ``src[i]`` as it is (power 0: float32 scales); the step of -power-bit
    levels of a block whose largest |x| is ``src[i]`` (power -2 to -8: one float32 multiply by ``LEVEL_FACTORS``, as
    ``spec.level_step``); or the float32 scale of a block of ``d`` elements from its float64 sum of |x|^power (2:
    sqrt(sum) / sqrt(d), "l2"; 1: sum / d, "l1"), IEEE float64 operations rounded once to float32, as
    ``spec.block_scales_from``."""
    if power == 0:
        return np.float32(src[i])
    if power < 0:
        return np.float32(np.float32(src[i]) * LEVEL_FACTORS[-power])
    if power == 2:
        return np.float32(math.sqrt(src[i]) / math.sqrt(np.float64(d)))
    return np.float32(src[i] / np.float64(d))


def nearest_code(values, s):
    """The code of scale ``s`` among a row's 256 non-increasing values (``spec.code_scales``, step 3).

    1. K = the first k with values[k] < s (256 if none): i = 256 - K values of the ascending table lie below s
       (``searchsorted``'s index, side "left"). The values not below s are a prefix, so K is found by halving steps
       with no branch on the data: K grows by 128, 64, ..., 1 wherever the value just past that step is not below s,
       then by 1 if the last is not (a binary search's unpredictable branches: the CPU's ``code_blocks`` took 2.1-2.6
       against 0.7-1.1 ms for a row of 65,536 scales, 4.9-5.8 against 3.7-4.3 for 16 rows of 4,096, same codes).
    2. i = 0 (s at or below the last value, 0): code 255.
    3. Otherwise hi = K - 1 (values[hi] >= s), lo = K: hi when values[hi] - s <= s - values[lo], in float64.
    """
    lo = 0
    step = 128
    while step > 0:
        if not values[lo + step - 1] < s:
            lo += step
        step //= 2
    if lo == 255 and not values[255] < s:
        lo = 256
    if lo == 256:
        return 255
    upper = lo - 1
    if np.float64(values[upper]) - np.float64(s) <= np.float64(s) - np.float64(values[lo]):
        return upper
    return lo
