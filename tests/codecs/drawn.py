"""Inputs hypothesis draws for the codecs' property tests, and their bit-for-bit comparison.

The property tests run the codec steps against the numpy reference on drawn inputs: random lengths on both sides
of the serial/threaded switch (at ``cpu.FLOOR`` in these tests: ``conftest.switch_at_the_floor``), the three
dtypes, signed zeros, subnormals, values near the dtype's limits. Every comparison is bit for bit; NaN (from
inf - inf when an error buffer and an input both sit near the float32 limit) must appear in the same places.
"""

from __future__ import annotations

import numpy as np
import torch
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

from compcoll.kernels import cpu


FLOAT32_EDGES = (0.0, -0.0, 1e-45, -1e-45, 1.1754942e-38, 1.1754944e-38, -1.1754944e-38, 3.4028235e38, -3.4028235e38)
DTYPES = (torch.float32, torch.float16, torch.bfloat16)
PROPERTY = settings(max_examples=80, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])


@st.composite
def vectors(draw, dtype: torch.dtype, numel: int | None = None) -> torch.Tensor:
    """A vector of ``dtype``: random normals at a drawn magnitude, some elements replaced by edge values."""
    if numel is None:
        numel = draw(st.one_of(st.integers(0, 300), st.integers(301, 20000),
                               st.integers(cpu.FLOOR - 8, cpu.FLOOR + 9000)))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    magnitude = draw(st.sampled_from([1e-44, 1e-39, 1e-30, 1e-3, 1.0, 1e4, 1e30, 1e38]))
    limit = float(torch.finfo(dtype).max)
    x = np.clip(rng.standard_normal(numel) * magnitude, -limit, limit).astype(np.float32)
    values = st.one_of(st.sampled_from(FLOAT32_EDGES), st.floats(width=32, allow_nan=False, allow_infinity=False))
    edits = draw(st.lists(st.tuples(st.integers(0, max(numel - 1, 0)), values), max_size=12 if numel else 0))
    for index, value in edits:
        x[index] = value
    return torch.from_numpy(np.clip(x, -limit, limit)).to(dtype)


def same(got: np.ndarray, want: np.ndarray) -> bool:
    """Equal bits, with NaN at the same places (any payload)."""
    got_nan, want_nan = np.isnan(got), np.isnan(want)
    bits = np.uint16 if got.dtype.itemsize == 2 else np.uint32
    return np.array_equal(got_nan, want_nan) and np.array_equal(got[~got_nan].view(bits), want[~want_nan].view(bits))
