"""1-bit codecs on torch tensors (scaled sign, binary randomization): dtypes, wire layout, kernels.

The algorithms call only this module; it picks the kernels for the tensor's device and
hands them zero-copy views. The wire layout of a 1-bit chunk is its packed signs (first
element in the most significant bit), preceded, where a scale travels with it, by that
scale as 4 native-endian float32 bytes.
"""

from __future__ import annotations

import math
from functools import lru_cache

import numpy as np
import torch

from .kernels import cpu as cpu_kernels
from .kernels.reference import STAGES, stream_key

SUPPORTED_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
SCALE_BYTES = 4


@lru_cache(maxsize=None)
def _lookup_table(dtype: torch.dtype) -> np.ndarray:
    """Exact float32 value of every 16-bit pattern of ``dtype``."""
    patterns = torch.arange(65536, dtype=torch.int32).to(torch.int16)
    return patterns.view(dtype).float().numpy()


def _source(tensor: torch.Tensor) -> tuple[np.ndarray, np.ndarray | None]:
    """A flat kernel view of ``tensor`` and the lookup table its dtype needs (or None)."""
    flat = tensor.detach().reshape(-1)
    if tensor.dtype == torch.float32:
        return flat.numpy(), None
    return flat.view(torch.int16).numpy().view(np.uint16), _lookup_table(tensor.dtype)


def _storage(tensor: torch.Tensor) -> np.ndarray:
    """A writable flat kernel view of an output tensor (16-bit types as raw int16)."""
    if tensor.dtype == torch.float32:
        return tensor.view(-1).numpy()
    return tensor.view(-1).view(torch.int16).numpy()


def check_device(tensor: torch.Tensor) -> None:
    if tensor.device.type != "cpu":
        raise ValueError(f"compcoll: tensors on {tensor.device} are not supported; use CPU tensors")


def l2_scale(sumsq: float, numel: int) -> float:
    """The seed's scale ||x||_2 / sqrt(d) from a float64 sum of squares, rounded to float32."""
    return float(np.float32(math.sqrt(sumsq) / math.sqrt(numel)))


def compensated_sumsq(tensor: torch.Tensor, error: torch.Tensor) -> float:
    """Sum of squares of ``error + pad(tensor)``; reads both, writes nothing."""
    check_device(tensor)
    src, lut = _source(tensor)
    return float(cpu_kernels.compensated_sumsq(src, lut, error.numpy(), src.size))


def sumsq(tensor: torch.Tensor) -> float:
    """Float64 sum of squares of a 1-D float32 tensor, in an order fixed by its length alone.

    The same kernel as ``compensated_sumsq`` (the tensor in the error slot, no source),
    so the result does not depend on the number of threads: ranks holding the same bits
    compute the same norm.
    """
    check_device(tensor)
    return float(cpu_kernels.compensated_sumsq(np.empty(0, np.float32), None, tensor.numpy(), 0))


def compensate_encode(
    tensor: torch.Tensor | None, error: torch.Tensor, scale: float, bits: torch.Tensor
) -> None:
    """bits <- packed sign(error + pad(tensor)); error <- (error + pad(tensor)) - scale * sign.

    ``tensor=None`` encodes ``error`` alone (the server step, where it holds the sum).
    """
    if tensor is None:
        src, lut = np.empty(0, np.float32), None
    else:
        check_device(tensor)
        src, lut = _source(tensor)
    cpu_kernels.compensate_encode(src, lut, error.numpy(), src.size, np.float32(scale), bits.numpy())


def accumulate_signs(
    bits: torch.Tensor, weights: torch.Tensor, base: torch.Tensor | None, out: torch.Tensor, count: int
) -> float:
    """out[:count] <- sum_r weights[r] * signs(bits[r]) (+ base); returns its sum of squares."""
    base_view = None if base is None else base.numpy()
    return float(
        cpu_kernels.accumulate_signs(bits.numpy(), weights.numpy(), base_view, out.numpy(), count)
    )


def decode(bits: torch.Tensor, scales: torch.Tensor, out: torch.Tensor) -> None:
    """out <- scales[r] * signs(bits[r]) for the rows of ``bits``, cut to out.numel().

    The values +-scale are rounded to the output dtype once (by torch), then selected.
    """
    positive = _storage(scales.to(out.dtype))
    negative = _storage((-scales).to(out.dtype))
    cpu_kernels.select_decode(bits.numpy(), positive, negative, _storage(out), out.numel())


def row_absmax(source: torch.Tensor, rows: int, length: int) -> torch.Tensor:
    """Per-row max |x| of ``source`` zero-padded to ``length`` and cut into ``rows`` rows (float32).

    A row holding NaN gets NaN, one holding Inf gets Inf.
    """
    check_device(source)
    src, lut = _source(source)
    out = torch.empty(rows, dtype=torch.float32)
    cpu_kernels.row_absmax(src, lut, src.size, length // rows, out.numpy())
    return out


def randomized_encode(
    source: torch.Tensor, scales: torch.Tensor, seed: int, step: int, stage: str, rank: int, start: int,
    bits: torch.Tensor,
) -> None:
    """bits[r] <- Birder's binary randomization of row r of ``source`` (zero-padded), scale scales[r].

    The random stream is the one of (seed, step, stage, rank); element i of ``source``
    draws the threshold of index start + i. ``bits`` is (rows, row_bytes), possibly a
    strided view of framed wire rows.
    """
    check_device(source)
    src, lut = _source(source)
    key = np.uint64(stream_key(seed, step, STAGES[stage], rank))
    cpu_kernels.randomized_encode(src, lut, src.size, scales.numpy(), key, start, bits.numpy())


def frame(rows: torch.Tensor, scales: torch.Tensor | float) -> torch.Tensor:
    """Write the scales at the heads of (n, SCALE_BYTES + nbytes) wire rows; return their sign bytes.

    A 1-D ``rows`` is one row, and ``scales`` may then be a single float.
    """
    table = rows.view(1, -1) if rows.dim() == 1 else rows
    values = torch.as_tensor(scales, dtype=torch.float32).reshape(-1, 1)
    table[:, :SCALE_BYTES].copy_(values.view(torch.uint8))
    return rows[..., SCALE_BYTES:]


def unframe(rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Split (n, SCALE_BYTES + nbytes) wire rows into n float32 scales and the sign bytes."""
    scales = rows[:, :SCALE_BYTES].flatten().clone().view(torch.float32)
    return scales, rows[:, SCALE_BYTES:]
