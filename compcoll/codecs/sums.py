"""The codecs' sums and scales, on every device in the reference's order.

Sums of |x|^p (compensated, accumulated from signs, by lanes and trees), finiteness, norms of segments, exact
division and row averages.
"""

from __future__ import annotations

import math
from functools import lru_cache
from typing import Any

import numpy as np
import torch

from .. import spec
from ..spec import BLOCK, LANES, SCALE_BYTES
from .dispatch import (UNREAD, Scalar, base_of, call, device_scalar, flag_finite, host_finite, host_value, no_source,
                       on_host, source_of, view, weights_of)
from .signs import compensate_encode, frame


def all_finite(tensor: torch.Tensor) -> bool:
    """Whether every element of ``tensor`` is finite. On a device, the host waits for the answer: a wait counted
    by ``kernels.launch.read_first`` (meta tensors: counted, and True).

    1. CPU: ``dispatch.host_finite`` (numpy's one pass, chunked).
    2. CUDA, 32- and 16-bit floats: one reduction, the sum in float64, is finite exactly when every
       element is (an Inf or NaN makes it Inf or NaN; finite ones are below 2^128 each, and
       overflowing float64 would take 2^896 of them). ``torch.isfinite`` alone takes four
       kernels on CUDA. Float64, whose finite values could overflow a sum: the sum of
       ``tensor * 0`` (0 for a finite element, NaN for an Inf or NaN), two kernels.
    """
    if on_host(tensor):
        return host_finite(tensor)
    return math.isfinite(host_value(finite_sum(tensor, torch.empty(1, dtype=torch.float64, device=tensor.device))))


def finite_sum(tensor: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """out[0] (one float64) <- a value finite exactly when every element of ``tensor`` is, with no host wait
    (``host_value`` reads it; ``all_finite`` is the two); returns ``out``.

    On the host 0 or NaN. On a device the float64 sum of ``tensor`` (of ``tensor * 0`` for float64: see
    ``all_finite``), reduced into ``out`` by torch in place (no allocation, so a replayed call runs it again:
    ``recording.Guard``).
    """
    if on_host(tensor):
        return flag_finite(tensor, out)
    source = tensor if tensor.dtype != torch.float64 else tensor.mul(0)
    return torch.sum(source.reshape(1, -1), 1, dtype=torch.float64, out=out)


def scale_from(total: Scalar, numel: int, scale: str) -> Scalar:
    """The float32 scale of ``numel`` elements from their float64 sum of |x|^p (``spec.scale_from``).

    A float gives a float. A device-resident sum (a one-element float64 CUDA tensor) gives
    a one-element float32 tensor on that device, computed there with the same bits.
    """
    if isinstance(total, torch.Tensor) and not on_host(total):
        out = torch.empty(1, dtype=torch.float32, device=total.device)
        call("scale_of", total, view(total), numel, spec.SCALES[scale], view(out))
        return out
    return float(spec.scale_from(float(total), numel, scale))


def _sum(kernel: str, tensor: torch.Tensor, read: bool, *args: Any, out: torch.Tensor | None = None) -> float | None:
    """Run a kernel that ends in a float64 sum: to the host as a float, or, not ``read`` on a device, left in one of
    the kernel's temporaries (no host round trip, no allocation) and None returned; or into ``out`` (a one-element
    float64 tensor on ``tensor``'s device, read later by ``host_value``: no host wait) and None returned."""
    if out is not None:
        if on_host(tensor):
            out.numpy()[0] = call(kernel, tensor, *args)
        else:
            call(kernel, tensor, *args, into=view(out))
        return None
    if not read and not on_host(tensor):
        call(kernel, tensor, *args, into=UNREAD)
        return None
    return float(call(kernel, tensor, *args))


def compensated_sum(tensor: torch.Tensor, error: torch.Tensor, scale: str = "l2", read: bool = True,
                    out: torch.Tensor | None = None) -> float | None:
    """Sum of |x|^p of x = ``error + pad(tensor)``, p the power of ``scale`` (``spec.SCALES``); reads both, writes
    nothing but ``out``. ``read=False``: on a device the sum is not read back (no host wait) and None is returned, so
    the kernel's device time can be measured queued behind other work (``bench/gpu_suite.py``). ``out``: a
    one-element float64 tensor on the device the sum goes into, None returned (``host_value`` reads it)."""
    src, lut = source_of(tensor)
    return _sum("compensated_power_sum", tensor, read, src, lut, view(error), tensor.numel(), spec.SCALES[scale],
                out=out)


def sumsq(tensor: torch.Tensor) -> float:
    """Float64 sum of squares of a 1-D float32 tensor, in an order fixed by its length alone.

    The same kernel as ``compensated_sum`` (the tensor in the error slot, no source),
    so the result does not depend on the number of threads: ranks holding the same bits
    compute the same norm.
    """
    return float(call("compensated_power_sum", tensor, no_source(tensor), None, view(tensor), 0, 2))


def segment_sumsq(tensor: torch.Tensor, bounds: tuple[int, ...], out: torch.Tensor) -> None:
    """out[j] (float64, on ``tensor``'s device) <- ``sumsq(tensor[bounds[j]:bounds[j + 1]])``, the same bits, for
    every segment j, in one kernel call (two launches on CUDA, no host wait): the norms of many layers of one flat
    vector without a call per layer.

    ``bounds`` is a tuple of non-decreasing offsets from 0 to at most ``tensor.numel()``; its device tables are
    made once per bounds and device (``_segment_tables``).
    """
    tables, blocks = _segment_tables(bounds, tensor.device)
    call("segment_sumsq", tensor, view(tensor), view(tables[0]), view(tables[1]), blocks, view(out))


@lru_cache(maxsize=64)
def _segment_tables(bounds: tuple[int, ...], device: torch.device) -> tuple[torch.Tensor, int]:
    """(int64 rows [bounds, firsts] on ``device``, the summation blocks of all segments): firsts[j] is segment j's
    first block, each segment max(1, ceil(length / BLOCK)) blocks of its own (``compensated_power_sum``'s)."""
    offsets = np.asarray(bounds, dtype=np.int64)
    blocks = np.maximum(1, -(-np.diff(offsets) // BLOCK))
    firsts = np.concatenate([[0], np.cumsum(blocks)]).astype(np.int64)
    return torch.from_numpy(np.stack([offsets, firsts])).to(device), int(firsts[-1])


def accumulate_signs(
    bits: torch.Tensor, weights: torch.Tensor, base: torch.Tensor | None, out: torch.Tensor, count: int,
    scale: str = "l2", read: bool = True,
) -> float | None:
    """out[:count] <- sum_r weights[r] * signs(bits[r]) (+ base); returns its sum of |out|^p (p: ``scale``'s power).

    ``read=False``: on a device the sum is not read back (no host round trip) and None is
    returned; on the CPU it is a float either way.
    """
    return _sum("accumulate_signs", out, read, *_accumulate_args(bits, weights, base, out, count, scale))


def accumulate_groups(bits: torch.Tensor, weights: torch.Tensor, out: torch.Tensor, count: int) -> None:
    """out[:count] <- for each group j of ``weights``' (groups, m): sum_r weights[j, r] * signs of bits row j * m + r,
    into segment j of out (8 elements a byte of a row, so segment j starts at j * 8 * bits.shape[1]), rank by rank in
    float32 as ``accumulate_signs`` sums one group: the averages of several shards in one kernel."""
    call("accumulate_groups", out, view(bits), view(weights), view(out), count)


def _accumulate_args(bits: torch.Tensor, weights: torch.Tensor, base: torch.Tensor | None, out: torch.Tensor,
                     count: int, scale: str) -> tuple:
    """The kernel arguments of ``accumulate_signs`` and ``accumulate_scale``."""
    out_view = view(out)
    return view(bits), weights_of(weights, out), base_of(base, out, out_view), out_view, count, spec.SCALES[scale]


def accumulate_scale(
    bits: torch.Tensor, weights: torch.Tensor, base: torch.Tensor | None, out: torch.Tensor, count: int, numel: int,
    scale: str = "l2", head: torch.Tensor | None = None,
) -> Scalar:
    """``accumulate_signs``, returning the float32 ``scale`` of ``numel`` elements from its sum (``scale_from``).

    On CUDA the same launch computes the scale and keeps it on the device (a one-element
    float32 tensor); on the CPU it is a float. ``head``, a wire row (uint8, its storage
    4-byte aligned: a buffer of its own), gets the scale in its frame head (``frame``): on
    CUDA the launch writes it there, and the scale returned is that head's float32 view.
    """
    args = _accumulate_args(bits, weights, base, out, count, scale)
    if on_host(out):
        value = scale_from(float(call("accumulate_signs", out, *args)), numel, scale)
        if head is not None:
            frame(head, value)
        return value
    slot = None if head is None else head[:SCALE_BYTES].view(torch.float32)
    return _device_scale("accumulate_signs", out, numel, scale, *args, slot=slot)


def _device_scale(kernel: str, tensor: torch.Tensor, numel: int, scale: str, *args: Any,
                  slot: torch.Tensor | None = None) -> torch.Tensor:
    """Run a CUDA kernel that ends in a float64 sum, with the float32 scale of ``numel`` elements from it written by
    the same launch into ``slot`` (one float32 element on the device; a new one when None); returns the slot. The sum
    itself goes into one of the kernel's temporaries: nothing reads it."""
    out = torch.empty(1, dtype=torch.float32, device=tensor.device) if slot is None else slot
    call(kernel, tensor, *args, scale=(numel, spec.SCALES[scale], view(out)))
    return out


def lane_count(count: int) -> int:
    """Float64 lane sums ``accumulate_lanes`` writes for ``count`` elements: LANES per BLOCK."""
    return max(1, -(-count // BLOCK)) * LANES


def accumulate_lanes(
    bits: torch.Tensor, weights: torch.Tensor, base: torch.Tensor | None, out: torch.Tensor, count: int,
    lanes: torch.Tensor, scale: str = "l2",
) -> None:
    """``accumulate_signs`` without the final sum: ``lanes`` (float64, ``lane_count(count)``) gets the
    (block, lane) sums of |out|^p, so that BLOCK-aligned pieces can be summed together by ``tree_sum``."""
    out_view = view(out)
    call("accumulate_lanes", out, view(bits), weights_of(weights, out), base_of(base, out, out_view), out_view, count,
         view(lanes), spec.SCALES[scale])


def tree_sum(lanes: torch.Tensor) -> float:
    """The pairwise tree sum of float64 lane sums (the last step of every scale's sum)."""
    return float(call("tree_sum", lanes, view(lanes)))


def tree_scale(lanes: torch.Tensor, numel: int, scale: str = "l2") -> Scalar:
    """The float32 ``scale`` of ``numel`` elements from the tree sum of their lane sums, as ``accumulate_scale``
    (on CUDA: in the tree's own launch, kept on the device)."""
    if on_host(lanes):
        return scale_from(tree_sum(lanes), numel, scale)
    return _device_scale("tree_sum", lanes, numel, scale, view(lanes))


def compensate_encode_agreed(tensor: torch.Tensor, error: torch.Tensor, sums: tuple[torch.Tensor, int, int],
                             me: int, senders: torch.Tensor, numel: int, scale: str, divisor: int,
                             weights: torch.Tensor, bits: torch.Tensor) -> None:
    """``compensate_encode`` by rank ``me``'s scale, and the server's weights, all from the ranks' agreed sums.

    ``sums`` = (table, first, step): rank r's float64 sum of |x|^p is table[first + r * step] (``p`` that of
    ``scale``; ``Agreement.device_sums``: where a round on the device left them). ``senders``: the int32 ranks whose
    weights the server takes, in its order, on ``error``'s device (as many as ``weights``).
    1. s_r = the float32 ``scale`` of ``numel`` elements from rank r's sum (``spec.scales_from``); weights[i] <-
       s_senders[i] / ``divisor`` in float32 (correctly rounded, as ``divide_``).
    2. ``compensate_encode`` of ``tensor`` into ``bits`` and ``error`` by s_me.
    On CUDA one launch does both, reading the sums where the round left them (``kernels.cuda.signs``' kernel of
    the name): no host value, no copy to the device.
    """
    table, first, step = sums
    if on_host(error):
        values = table.numpy()
        weights.numpy()[:] = spec.scales_from(values[first + senders.numpy().astype(np.int64) * step], numel, scale)
        divide_(weights, divisor)
        compensate_encode(tensor, error, spec.scales_from(values[first + me * step:][:1], numel, scale)[0], bits)
        return
    src, lut = source_of(tensor)
    call("compensate_encode_agreed", error, src, lut, view(error), tensor.numel(), view(table), first, step, me,
         view(senders), numel, spec.SCALES[scale], divisor, view(weights), view(bits))


def divide_(values: torch.Tensor, divisor: float) -> torch.Tensor:
    """values /= divisor in place, correctly rounded on every device (the divisor rounded to the values' dtype).

    torch's CUDA division by a Python number multiplies by its reciprocal (1/3 is not
    exact), so the divisor goes in as a 0-dim tensor on the device (``device_scalar``), which takes the IEEE
    division the CPU and the numpy reference do; on the CPU numpy divides, correctly
    rounded too (as torch's CPU division by a Python number).
    """
    if on_host(values):
        array = values.numpy()
        np.divide(array, array.dtype.type(divisor), out=array)
        return values
    return values.div_(device_scalar(values, divisor))


def average_rows(rows: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """out <- the float32 average of the rows of ``rows`` ((n, m) float32): summed in row order, then divided by n,
    in one kernel (``reference.average_rows``'s bits on every device); returns ``out``."""
    call("average_rows", out, view(rows), view(out))
    return out
