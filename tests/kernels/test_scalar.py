"""compcoll.kernels.scalar: the roundings the CUDA decode compiles equal torch's, on many float32 bit patterns."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from numba import vectorize

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
