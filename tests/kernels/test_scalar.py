"""compcoll.kernels.scalar: the roundings the CUDA decode compiles equal torch's, on many float32 bit patterns."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from numba import njit, vectorize

from compcoll.kernels import scalar

EDGES = [0, 0x80000000, 0x00000001, 0x007FFFFF, 0x33000000, 0x33000001, 0x337FFFFF, 0x387FEFFF, 0x387FF000,
         0x387FFFFF, 0x38800000, 0x3F808000, 0x3F818000, 0x477FE000, 0x477FEFFF, 0x477FF000, 0x7F7FFFFF, 0x7F800000,
         0xFF800000]
"""Bit patterns at the roundings' edges: zeros, float32 subnormals, float16's subnormal range and its ties, the
smallest normal, bfloat16 ties (odd and even), float16's largest and the way to infinity, float32's largest,
infinities."""


def _patterns() -> np.ndarray:
    """2M random float32 bit patterns, every 4099th of all 2^32, and ``EDGES``, without NaN (as int64)."""
    rng = np.random.default_rng(2026)
    found = np.concatenate([rng.integers(0, 1 << 32, 2_000_000, dtype=np.int64),
                            np.arange(0, 1 << 32, 4099, dtype=np.int64), np.array(EDGES, np.int64)])
    return found[(found & 0x7FFFFFFF) <= 0x7F800000]


@pytest.mark.parametrize("dtype, rounding", [(torch.float16, scalar.half_bits),
                                             (torch.bfloat16, scalar.bfloat16_bits)])
def test_the_roundings_of_a_float32_equal_torchs(dtype: torch.dtype, rounding) -> None:
    patterns = _patterns()
    values = torch.from_numpy(patterns.astype(np.uint32).view(np.float32))
    want = values.to(dtype).view(torch.int16).numpy().view(np.uint16).astype(np.int64)
    got = vectorize(["int64(int64)"])(rounding)(patterns)
    wrong = np.flatnonzero(got != want)
    assert wrong.size == 0, [(hex(patterns[i]), hex(got[i]), hex(want[i])) for i in wrong[:5]]


def _nearest(values: np.ndarray, s: float) -> int:
    """``nearest_code``'s rule, by numpy: K the first index of a value below s (256 if none); code 255 for K = 256,
    else K - 1 where values[K - 1] - s <= s - values[K] in float64, else K."""
    below = np.nonzero(values < s)[0]
    k = int(below[0]) if below.size else 256
    if k == 256:
        return 255
    return k - 1 if np.float64(values[k - 1]) - np.float64(s) <= np.float64(s) - np.float64(values[k]) else k


def test_nearest_code_is_the_first_value_below_by_its_rule() -> None:
    """``nearest_code`` (halving steps, no branch on the data) = the rule by numpy on random non-increasing tables of
    256 float32 values, some ending at 0 (as ``spec.SCALE_STEPS``' do) and some above it, runs of equal values
    among them and at their end, and on scales at every
    value, just above and below it, halfway between neighbours, 0, the first value and NaN (the row's largest bounds
    every scale from above)."""
    rng = np.random.default_rng(61)
    near = njit(scalar.nearest_code)
    for case in range(40):
        values = np.sort(rng.random(256) * 10.0 ** rng.integers(-8, 8)).astype(np.float32)[::-1].copy()
        if case % 2:
            values[-1] = 0.0
        if case % 5 == 0:
            values[100:140] = values[100]
        if case % 3 == 0:
            values[-3:] = values[-3]
        scales = np.concatenate([values, np.nextafter(values, np.float32(0)), np.nextafter(values, values[0]),
                                 (values[:-1] / 2 + values[1:] / 2), rng.random(200).astype(np.float32) * values[0],
                                 np.array([0.0, np.nan], np.float32)]).astype(np.float32)
        scales = scales[~(scales > values[0])]
        got = [near(values, s) for s in scales]
        want = [_nearest(values, s) if s == s else 255 for s in scales]
        assert got == want, case
