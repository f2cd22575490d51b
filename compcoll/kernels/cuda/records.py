"""A device sum's float32 scale, and an agreement round's record of it, with the host's IEEE bits, by one thread."""

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


@cuda.jit
def _agreement_record(total, signature, d, root_d, mode, summed, record):
    if cuda.grid(1) == 0:
        t = total[0]
        finite = not (math.isinf(t) or math.isnan(t))
        value = np.float64(scale_value(t, d, root_d, mode == 1)) if finite and mode != 0 else 0.0
        if summed:
            bits = np.int64(signature)
            for i in range(4):
                b = np.float64((bits >> (8 * i)) & 0xFF)
                record[i] = b
                record[4 + i] = b * b
            record[8] = 0.0
            record[9] = 0.0 if finite else 1.0
            record[10] = value
            record[11] = 1.0 if finite else 0.0
        else:
            record[0] = signature
            record[1] = 1.0 if finite else 0.0
            record[2] = value


def agreement_record(total, signature, d, power, summed, record, stream=0) -> None:
    """An agreement round's record of the float64 sum in total[0], written where the sum is, so that a transport
    on the device exchanges it with no host wait (``codecs.agreement_record``'s fields: the gathered round's
    (signature, finite?, value), or the ``summed`` round's bytes, squares, flags, value and finite?). value is the
    float32 scale of ``d`` elements from total[0] as ``scale_of`` gives it, or 0.0 where it is not finite or
    ``power`` is 0. One thread."""
    mode = 0 if power == 0 else 1 if power == 2 else 2
    launch(_agreement_record, 1, 1, stream, total, np.float64(signature), d, math.sqrt(d), mode, bool(summed), record)
