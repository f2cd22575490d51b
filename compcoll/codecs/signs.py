"""The 1-bit sign codes and their wire frames: encodes (compensated, Birder's randomized) and decodes.

A row's scale is written at (``frame``) or read from (``unframe``) its head as 4 native-endian float32 bytes.
"""

from __future__ import annotations

import numpy as np
import torch

from ..kernels.arrays import DeviceArray
from ..spec import SCALE_BYTES
from .dispatch import (RAW, Scalar, call, call_flagged, no_source, on_host, pinned_like, result_into, source_of,
                       storage_of, to_device, view)


def compensate_encode(
    tensor: torch.Tensor | None, error: torch.Tensor, scale: Scalar, bits: torch.Tensor
) -> None:
    """bits <- packed sign(error + pad(tensor)); error <- (error + pad(tensor)) - scale * sign.

    ``tensor=None`` encodes ``error`` alone (the server step, where it holds the sum).
    ``scale`` may be a device-resident scale (``scale_from``), which the CUDA kernel reads
    from device memory.
    """
    src, lut = (no_source(error), None) if tensor is None else source_of(tensor)
    n_src = 0 if tensor is None else tensor.numel()
    on_device = isinstance(scale, torch.Tensor) and not on_host(error)
    call("compensate_encode", error, src, lut, view(error), n_src,
         view(scale) if on_device else np.float32(float(scale)), view(bits))


def decode(bits: torch.Tensor, scales: torch.Tensor, out: torch.Tensor) -> None:
    """out <- scales[r] * signs(bits[r]) for the rows of ``bits``, cut to out.numel().

    The values +-scale are rounded to the output dtype once (by torch), then selected.
    """
    if on_host(out) and out.dtype == torch.float32 and scales.dtype == torch.float32:
        _decode_host(view(bits), scales.numpy(), out)
        return
    scales = scales.to(device=out.device)
    positive = storage_of(scales.to(out.dtype))
    negative = storage_of((-scales).to(out.dtype))
    call("select_decode", out, view(bits), positive, negative, storage_of(out), out.numel())


def _decode_host(bits: np.ndarray, positive: np.ndarray, out: torch.Tensor) -> None:
    """``decode`` into a float32 CPU ``out`` from numpy views of the sign rows and their scales."""
    call("select_decode", out, bits, positive, -positive, out.numpy().reshape(-1), out.numel())


def decode_framed(rows: torch.Tensor, out: torch.Tensor) -> None:
    """out (contiguous) <- the decode of (n, SCALE_BYTES + nbytes) wire rows: ``unframe``, then ``decode``.

    On CUDA one kernel reads the scales from the rows' heads and rounds them to ``out``'s
    dtype itself (``kernels.cuda.decode_framed``); on the CPU a 16-bit ``out`` has them rounded
    by torch first.
    """
    if not on_host(rows):
        call("decode_framed", rows, view(rows), DeviceArray.flat(out, RAW[out.dtype][1]), out.numel(),
             str(out.dtype).removeprefix("torch."))
    elif out.dtype == torch.float32:
        table = rows.numpy()
        _decode_host(table[:, SCALE_BYTES:], _heads(table), out)
    else:
        scales, signs = unframe(rows)
        decode(signs, scales, out.view(-1))


def frame(rows: torch.Tensor, scales: torch.Tensor | float) -> torch.Tensor:
    """Write the scales at the heads of (n, SCALE_BYTES + nbytes) wire rows; return their sign bytes.

    A 1-D ``rows`` is one row, and ``scales`` may then be a single float.
    """
    if on_host(rows):
        values = scales.numpy().reshape(-1) if isinstance(scales, torch.Tensor) else scales
        table = rows.numpy()
        if rows.dim() == 1:
            table[:SCALE_BYTES].view(np.float32)[:] = values
            return rows[SCALE_BYTES:]
        table[:, :SCALE_BYTES].view(np.float32)[:, 0] = values
        return rows[:, SCALE_BYTES:]
    table = rows.view(1, -1) if rows.dim() == 1 else rows
    values = torch.as_tensor(scales, dtype=torch.float32).reshape(-1, 1)
    table[:, :SCALE_BYTES].copy_(values.view(torch.uint8))
    return rows[..., SCALE_BYTES:]


def unframe(rows: torch.Tensor, divisor: int = 1, out: torch.Tensor | None = None
            ) -> tuple[torch.Tensor, torch.Tensor]:
    """Split (n, SCALE_BYTES + nbytes) wire rows into their n float32 scales / ``divisor`` (IEEE float32 division,
    as ``divide_``: the weights s / n), into ``out`` (n float32 elements) where given, and the sign bytes (a
    view); on CUDA in one kernel (``head_weights``)."""
    if on_host(rows):
        scales = _heads(rows.numpy())
        if divisor != 1:
            np.divide(scales, np.float32(divisor), out=scales)
        if out is None:
            return torch.from_numpy(scales), rows[:, SCALE_BYTES:]
        out.numpy()[:] = scales
        return out, rows[:, SCALE_BYTES:]
    scales = result_into(out, (rows.shape[0],), torch.float32, rows.device)
    call("head_weights", rows, view(rows), divisor, view(scales))
    return scales, rows[:, SCALE_BYTES:]


def _heads(table: np.ndarray) -> np.ndarray:
    """The float32 scales at the heads of host wire rows (a copy)."""
    return table[:, :SCALE_BYTES].copy().view(np.float32).reshape(-1)


def row_absmax(source: torch.Tensor, rows: int, length: int, out: torch.Tensor | None = None,
               finite: torch.Tensor | None = None) -> torch.Tensor:
    """Per-row max |x| of ``source`` zero-padded to ``length`` and cut into ``rows`` rows (float32), into ``out``
    (``rows`` float32 elements on ``source``'s device) where given.

    A row holding NaN gets NaN, one holding Inf gets Inf. ``finite`` (a one-element float64 tensor on the device)
    gets 0.0 where every maximum is finite, else NaN: on a device in the launch that reduces the rows, on the host
    after it (``dispatch.call_flagged``).
    """
    src, lut = source_of(source)
    out = result_into(out, (rows,), torch.float32, source.device)
    call_flagged("row_absmax", source, out, finite, src, lut, source.numel(), length // rows)
    return out


def randomized_encode(source: torch.Tensor, scales: torch.Tensor, key: int | torch.Tensor, start: int,
                      rows: torch.Tensor) -> None:
    """Wire row r <- scales[r] at its head (as ``frame``), then Birder's binary randomization of row r of
    ``source`` (zero-padded) with that scale, in one kernel.

    The random stream is ``key`` (``spec.stream_key`` of (seed, step, stage, rank)); element i of ``source``
    draws the threshold of index start + i. ``rows`` is (n, SCALE_BYTES + row_bytes). ``key`` is an int, or one
    element of the int64 tensor ``stream_keys`` wrote on ``source``'s device, which a device's kernel reads there
    (so a replayed launch draws each call's own stream); an int on a device is copied there first.
    """
    src, lut = source_of(source)
    scales = scales.to(device=source.device, dtype=torch.float32)
    if on_host(source):
        stream = np.uint64(key if isinstance(key, int) else int(key.numpy().view(np.uint64)[0]))
    else:
        if isinstance(key, int):
            key = stream_keys([key], torch.empty(1, dtype=torch.int64, device=source.device))
        stream = DeviceArray(key.data_ptr(), (1,), (8,), np.dtype(np.uint64), key)
    call("randomized_encode", source, src, lut, source.numel(), view(scales), stream, start, view(rows))


def stream_keys(keys: list[int], out: torch.Tensor, staging: torch.Tensor | None = None) -> torch.Tensor:
    """out[j] <- the 64 bits of ``keys[j]`` (``spec.stream_key``s, below 2^64) as int64, for ``randomized_encode``;
    returns ``out``.

    1. Written into ``out`` itself on the host; for a CUDA ``out`` into fresh pinned memory (``pinned_like``);
       elsewhere into ``staging`` (host int64, as long as ``out``; a new one where None).
    2. On a device, copied into ``out`` with no host wait (``to_device``).
    """
    host = out if out.is_cpu else pinned_like(out) if out.is_cuda else (
        torch.empty(out.numel(), dtype=torch.int64) if staging is None else staging)
    host.numpy().view(np.uint64)[:] = keys
    return out if host is out else to_device(host, out)
