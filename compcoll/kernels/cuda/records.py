"""A device sum's float32 scale, with the host's IEEE bits, by one thread."""

from __future__ import annotations

import math

import numpy as np
from numba import cuda

from ..launch import launch


@cuda.jit(device=True)
def scale_value(total, d, root_d, l2):
    """The float32 scale of ``d`` elements from their float64 sum of |x|^power, as ``spec.scale_from``."""
    if d == 0:
        return np.float32(0.0)
    if l2:
        return np.float32(math.sqrt(total) / root_d) if total >= 0 else np.float32(math.nan)
    return np.float32(total / d)


@cuda.jit
def _scale_of(total, d, root_d, l2, out):
    if cuda.grid(1) == 0:
        out[0] = scale_value(total[0], d, root_d, l2)


def scale_of(total, d, power, out, stream=0) -> None:
    """out[0] <- the float32 scale of ``d`` elements from their float64 sum of |x|^power in total[0],
    as ``spec.scale_from`` on the host: float64 sqrt and division (IEEE, correctly rounded), then
    rounded to float32. One thread; both arrays on the device, so the scale never crosses to the host."""
    launch(_scale_of, 1, 1, stream, total, d, math.sqrt(d), power == 2, out)
