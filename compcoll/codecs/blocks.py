"""The block-scaled codes: their 1-bit signs, and the uniform levels of a step per block.

A scale per block of elements, coded against its row's largest, goes in front of the row's bytes.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np
import torch

from .. import spec
from ..kernels.arrays import DeviceArray
from ..spec import SCALE_BYTES
from .dispatch import RAW, KernelView, base_of, call, call_flagged, no_source, on_host, result_into, source_of, view
from .signs import unframe
from .sums import accumulate_signs


def block_sums(tensor: torch.Tensor | None, error: torch.Tensor, block_size: int, scale: str = "l2",
               rows: int = 1, out: torch.Tensor | None = None, finite: torch.Tensor | None = None) -> torch.Tensor:
    """Float64 sums of |x|^p over the blocks of x = ``error + pad(tensor)`` (p: ``scale``'s power), on ``error``'s
    device: x cut into ``rows`` equal rows, each into blocks of ``block_size`` from its start, the last one
    shorter where needed (``spec.block_lengths``); row-major; into ``out`` (float64, one element a block) where
    given. ``tensor=None`` sums ``error`` alone. ``finite`` (a one-element float64 tensor on the device) gets
    0.0 where every sum is finite, else NaN (``dispatch.call_flagged``). Writes nothing else."""
    src, lut = (no_source(error), None) if tensor is None else source_of(tensor)
    row_len = error.numel() // rows
    blocks = rows * -(-row_len // block_size)
    sums = result_into(out, (blocks,), torch.float64, error.device)
    call_flagged("block_power_sums", error, sums, finite, src, lut, view(error),
                 0 if tensor is None else tensor.numel(), block_size, row_len, spec.SCALES[scale])
    return sums


def encode_blocks(tensor: torch.Tensor | None, error: torch.Tensor, scales: torch.Tensor, block_size: int,
                  bits: torch.Tensor) -> None:
    """``compensate_encode`` with scale ``scales[i // block_size]`` for element i; ``bits`` is (rows, row_bytes),
    possibly the sign bytes of framed wire rows (``frame_scales``)."""
    src, lut = (no_source(error), None) if tensor is None else source_of(tensor)
    call("encode_blocks", error, src, lut, view(error), 0 if tensor is None else tensor.numel(), view(scales),
         block_size, view(bits))


def accumulate_blocks(bits: torch.Tensor, weights: torch.Tensor, block_size: int, base: torch.Tensor | None,
                      out: torch.Tensor, count: int) -> None:
    """out[:count] <- sum_r weights[r, i // block_size] * signs(bits[r]) (+ base), rank by rank in float32."""
    out_view = view(out)
    call("accumulate_blocks", out, view(bits), view(weights), block_size, base_of(base, out, out_view), out_view,
         count)


def _raw_host(tensor: torch.Tensor) -> np.ndarray:
    """The raw bits of a contiguous CPU float tensor as a flat unsigned numpy view (no copy; numpy has no bfloat16)."""
    torch_int, numpy_uint, _ = RAW[tensor.dtype]
    return tensor.reshape(-1).view(torch_int).numpy().view(numpy_uint)


def decode_framed_blocks(rows: torch.Tensor, per_row: int, block_size: int, out: torch.Tensor) -> None:
    """out (contiguous; float32, float16 or bfloat16) <- the decode of (n, SCALE_BYTES + per_row + nbytes)
    block-framed wire rows, cut to out.numel(): element k of row r is +-s, s its block's scale
    (``unframe_blocks``) rounded to out's dtype (to nearest even, as torch rounds), - for a clear bit.

    1. CUDA: one kernel decodes each element's scale from its row's head and code, rounds it
       and writes it or its negation (``kernels.cuda.decode_framed_blocks``).
    2. CPU: the block scales decoded (``unframe_blocks``) and rounded by torch, then each
       element's, or its sign bit flipped, on raw bits (``kernels.cpu.decode_blocks``).
    """
    _, raw, sign = RAW[out.dtype]
    if not on_host(rows):
        call("decode_framed_blocks", out, view(rows), _steps(rows), per_row, block_size,
             DeviceArray.flat(out, raw), out.numel(), str(out.dtype).removeprefix("torch."))
        return
    scales, bits = unframe_blocks(rows, per_row)
    rounded = _raw_host(scales.to(out.dtype)).reshape(scales.shape)
    call("decode_blocks", out, bits.numpy(), rounded, block_size, raw(sign), _raw_host(out), out.numel())


@lru_cache(maxsize=None)
def _scale_steps(device: torch.device) -> torch.Tensor:
    """``spec.SCALE_STEPS`` on ``device`` (copied, so every device holds the host's bits)."""
    return torch.from_numpy(spec.SCALE_STEPS).to(device)


def _steps(like: torch.Tensor) -> KernelView:
    """The kernel view of ``spec.SCALE_STEPS`` for ``like``'s kernels: the host's array, or its copy on the device."""
    return spec.SCALE_STEPS if on_host(like) else view(_scale_steps(like.device))


def frame_scales(rows: torch.Tensor, values: torch.Tensor, scale: str | None = None, block_size: int = 1,
                 row_len: int = 1, out: torch.Tensor | None = None, bits: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    """Code the block scales of (n, SCALE_BYTES + m + nbytes) wire rows against each row's largest, in front of
    the rows' bytes: ``spec.code_scales``' bits, in one kernel on every device (``kernels.cpu.code_blocks``).

    ``values`` holds the n * m scales (float32; ``scale`` None), or with ``bits`` of 2-8 the float32 block maxima
    |x| whose ``bits``-bit level steps (``spec.level_step``: one float32 multiply) are coded, or the float64 sums of
    |x|^p of blocks of ``block_size`` elements of rows of ``row_len`` (``block_sums``), whose ``scale``
    ("l2", "l1": ``spec.block_scales_from``) is coded.
    1. Row r's largest scale, ref_r, as 4 bytes at its head; then the m codes of its scales.
    2. The decoded scales v[code] (what every rank uses, the encoder included), into ``out``
       (n * m float32 elements) where given.

    Returns:
        (the decoded scales, (n, m) float32; the rows' bytes behind the codes, a view).
    """
    n = rows.shape[0]
    m = values.numel() // n
    decoded = result_into(out, (n, m), torch.float32, rows.device)
    power = (-bits if bits > 1 else 0) if scale is None else spec.SCALES[scale]
    call("code_blocks", decoded, view(values.reshape(-1)), block_size, row_len, power, _steps(rows), view(rows),
         view(decoded))
    return decoded, rows[:, SCALE_BYTES + m:]


def unframe_blocks(rows: torch.Tensor, per_row: int, divisor: int = 1, out: torch.Tensor | None = None
                   ) -> tuple[torch.Tensor, torch.Tensor]:
    """Split (n, SCALE_BYTES + per_row + nbytes) wire rows into the (n, per_row) decoded float32 block scales (into
    ``out``, n * per_row float32 elements, where given) and the sign bytes (a view):
    float32(float64(ref_r) * SCALE_STEPS[code]) / ``divisor`` (IEEE float32 division, as ``divide_``: the weights
    s / n), in one kernel (``decode_codes``)."""
    n = rows.shape[0]
    decoded = result_into(out, (n, per_row), torch.float32, rows.device)
    call("decode_codes", decoded, view(rows), _steps(rows), divisor, view(decoded))
    return decoded, rows[:, SCALE_BYTES + per_row:]


def accumulate_framed(rows: torch.Tensor, per_row: int, divisor: int, block_size: int, base: torch.Tensor | None,
                      out: torch.Tensor, count: int, bits: int = 1, weights: torch.Tensor | None = None) -> None:
    """out[:count] <- the sum over the (n, SCALE_BYTES + per_row + bits * nbytes) framed wire ``rows``, rank by rank
    in float32 (+ base, 1 bit only), of each element's sign or ``bits``-bit level times its block's weight: its
    decoded scale / ``divisor`` (``unframe_blocks``' weights). ``per_row`` 0: rows framed by their head alone (the
    1-bit frames), its scale / ``divisor`` the weight of the whole row (``unframe``'s weights; ``block_size``
    unread).

    1. CUDA: one kernel decodes each rank's weights from its row's head (and codes) as it adds
       (``kernels.cuda.accumulate_framed_blocks`` / ``accumulate_framed_levels`` / ``accumulate_frames``): no table
       of weights, one launch fewer than the two steps, and no sum of |out|^p.
    2. CPU: ``unframe_blocks`` (or ``unframe``) into ``weights`` (n * per_row, or n, float32 elements; allocated
       where None), then ``accumulate_blocks``, ``accumulate_levels`` (or ``accumulate_signs``): the same bits.
    """
    payload = rows[:, SCALE_BYTES + per_row:]
    if not on_host(rows):
        out_view = view(out)
        if per_row == 0:
            call("accumulate_frames", out, view(payload), view(rows), divisor, base_of(base, out, out_view), out_view,
                 count)
        elif bits == 1:
            call("accumulate_framed_blocks", out, view(payload), view(rows), _steps(rows), divisor, block_size,
                 base_of(base, out, out_view), out_view, count)
        else:
            call("accumulate_framed_levels", out, view(payload), view(rows), _steps(rows), divisor, block_size, bits,
                 out_view, count)
        return
    if per_row == 0:
        weights, payload = unframe(rows, divisor, weights)
        accumulate_signs(payload, weights, base, out, count)
        return
    weights, payload = unframe_blocks(rows, per_row, divisor, weights)
    if bits == 1:
        accumulate_blocks(payload, weights, block_size, base, out, count)
    else:
        accumulate_levels(payload, weights, block_size, bits, out, count)


def block_absmax(tensor: torch.Tensor, error: torch.Tensor, block_size: int, rows: int,
                 out: torch.Tensor | None = None, finite: torch.Tensor | None = None) -> torch.Tensor:
    """Float32 max |x| over the blocks of x = ``error + pad(tensor)`` cut into ``rows`` equal rows (``block_sums``'
    blocks), on ``error``'s device, into ``out`` where given; NaN where a block holds NaN. ``finite`` as for
    ``block_sums``. Writes nothing else."""
    src, lut = source_of(tensor)
    row_len = error.numel() // rows
    blocks = rows * -(-row_len // block_size)
    out = result_into(out, (blocks,), torch.float32, error.device)
    call_flagged("block_absmax", error, out, finite, src, lut, view(error), tensor.numel(), block_size, row_len)
    return out


def encode_levels(tensor: torch.Tensor, error: torch.Tensor, steps: torch.Tensor, block_size: int, bits: int,
                  planes: torch.Tensor) -> None:
    """planes <- the ``bits``-bit levels of x = error + pad(tensor) with step ``steps[i // block_size]`` for element i
    (``reference.compress_levels``); error <- x - their values. ``planes`` is (rows, bits * row_bytes), possibly the
    level bytes of framed wire rows (``frame_scales``)."""
    src, lut = source_of(tensor)
    call("encode_levels", error, src, lut, view(error), tensor.numel(), view(steps), block_size, bits,
         view(planes))


def accumulate_levels(planes: torch.Tensor, weights: torch.Tensor, block_size: int, bits: int, out: torch.Tensor,
                      count: int) -> None:
    """out[:count] <- sum_r float32(level_r * weights[r, i // block_size]) rank by rank in float32, level_r the
    centred level of rank r's row (``reference.compressed_reduce_scatter``)."""
    call("accumulate_levels", out, view(planes), view(weights), block_size, bits, view(out), count)


def decode_levels(planes: torch.Tensor, steps: torch.Tensor, block_size: int, bits: int, out: torch.Tensor,
                  count: int) -> None:
    """out[:count] <- every row's levels, row r into out[r * row_len:] (row_len = 8 * its bytes a plane), each
    float32(level_r * steps[r, k // block_size]) as ``accumulate_levels`` gives for one row: the decode of n served
    rows in one kernel (``kernels.reference.collectives._levels_allreduce``, step 3)."""
    call("decode_levels", out, view(planes), view(steps), block_size, bits, view(out), count)
