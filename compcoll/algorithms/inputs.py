"""Local checks of an allreduce's arguments, made before any communication."""

from __future__ import annotations

import torch

from .. import codecs
from ..spec import PROTOCOLS, SCALES, check_bits


def unviewed(value: object) -> str:
    """What an argument that is no tensor is, for an error: its type, and for an array that exports DLPack, why torch
    could not view it (``arrays.accepts_arrays``)."""
    kind = f"{type(value).__module__}.{type(value).__name__}"
    if not hasattr(value, "__dlpack__"):
        return kind
    return (f"a {kind} that torch.from_dlpack cannot view (read-only where the call writes it, a negative stride where "
            f"it writes it, or a dtype or device torch does not take)")


def check_tensor(what: str, tensor: torch.Tensor, out: torch.Tensor | None, carries_meta: bool) -> None:
    """The input is a supported torch tensor on a device with kernels (meta where the communicator ``carries_meta``),
    and ``out`` fits it."""
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(
            f"{what}: tensor must be a torch.Tensor or an array that exports DLPack (numpy, cupy), got "
            f"{unviewed(tensor)}"
        )
    if tensor.dtype not in codecs.SUPPORTED_DTYPES:
        raise TypeError(f"{what}: tensor dtype {tensor.dtype} is not supported; use float32, float16 or bfloat16")
    if out is not None and (
        not isinstance(out, torch.Tensor)
        or out.shape != tensor.shape
        or out.dtype != tensor.dtype
        or out.device != tensor.device
        or not out.is_contiguous()
    ):
        raise ValueError(
            f"{what}: out must be contiguous with the tensor's shape {tuple(tensor.shape)}, "
            f"dtype {tensor.dtype} and device {tensor.device}"
        )
    codecs.check_device(tensor, carries_meta)


def check_error_buffer(what: str, name: str, buf: torch.Tensor, tensor: torch.Tensor) -> None:
    """An error-feedback buffer is a contiguous 1-D float32 tensor on the input's device."""
    if not isinstance(buf, torch.Tensor):
        raise TypeError(f"{what}: {name} must be a torch.Tensor or a writable array that exports DLPack (numpy, "
                        f"cupy), got {unviewed(buf)}")
    if buf.dtype != torch.float32:
        raise TypeError(f"{what}: {name} must be float32, got {buf.dtype}")
    if buf.device != tensor.device:
        raise ValueError(f"{what}: {name} is on {buf.device}, tensor on {tensor.device}")
    if buf.dim() != 1 or not buf.is_contiguous():
        raise ValueError(f"{what}: {name} must be a contiguous 1-D float32 tensor, got shape {tuple(buf.shape)}")


def check_length(what: str, name: str, buf: torch.Tensor, length: int, formula: str) -> None:
    """An error-feedback buffer holds exactly ``length`` elements (``formula`` says why)."""
    if buf.numel() != length:
        raise ValueError(
            f"{what}: {name} must be a contiguous 1-D float32 tensor of {length} elements ({formula}), "
            f"got shape {tuple(buf.shape)}"
        )


def check_protocol(what: str, protocol: str, choices: tuple[str, ...] = PROTOCOLS) -> None:
    """``protocol`` names one of ``choices``: the 1-bit allreduce's protocols (``spec.PROTOCOLS``) unless given."""
    if not isinstance(protocol, str) or protocol not in choices:
        raise ValueError(f"{what}: protocol {protocol!r} is not one of {choices}")


def check_scale(what: str, scale: str) -> None:
    """``scale`` names one of the 1-bit scales (``spec.SCALES``)."""
    if not isinstance(scale, str) or scale not in SCALES:
        raise ValueError(f"{what}: scale {scale!r} is not one of {tuple(SCALES)} (l2: DeepSpeed's ||x||/sqrt(d); "
                         f"l1: mean |x|)")


def check_levels(what: str, bits: int, protocol: str, block_size: int | None) -> None:
    """``bits`` is one of ``spec.LEVEL_BITS``; levels (more than 1 bit) need gather-scatter with block scales."""
    check_bits(what, bits)
    if bits > 1 and (protocol != "gather_scatter" or block_size is None):
        raise ValueError(f"{what}: bits={bits} (levels) needs protocol='gather_scatter' and a block_size")


def check_disjoint(what: str, named: tuple[tuple[str, torch.Tensor | None], ...],
                   may_overlap: tuple[frozenset[str], ...] = ()) -> None:
    """No two of the ``named`` tensors share memory, so that no kernel writes one while it reads or writes another
    (an error buffer overwritten by the result, a server error inside the worker's: other bits than the reference's,
    or lost error feedback, with nothing said).

    1. Each tensor's byte range on its device: from its first element to past its last (an empty or meta tensor
       has none). Two ranges that meet on one device overlap: conservative for interleaved strided views.
    2. "out" may be "tensor" itself (the same memory, shape and strides: an in-place call); a pair in
       ``may_overlap`` may overlap at will.
    Raises ValueError naming the first pair that overlaps otherwise.
    """
    spans = [(name, tensor, _span(tensor)) for name, tensor in named]
    for i, (a, ta, sa) in enumerate(spans):
        for b, tb, sb in spans[i + 1:]:
            if sa is None or sb is None or sa[0] != sb[0] or sa[2] <= sb[1] or sb[2] <= sa[1]:
                continue
            pair = frozenset((a, b))
            if pair in may_overlap:
                continue
            if pair == _IN_PLACE:
                if (ta.data_ptr(), ta.shape, ta.stride()) == (tb.data_ptr(), tb.shape, tb.stride()):
                    continue
                raise ValueError(f"{what}: out overlaps tensor without being it; pass the tensor itself as out for "
                                 f"an in-place call, or memory of its own")
            raise ValueError(f"{what}: {a} and {b} share memory; each needs memory of its own")


_IN_PLACE = frozenset(("tensor", "out"))
"""The pair that may be one tensor: an in-place call."""


def _span(tensor: torch.Tensor | None) -> tuple[torch.device, int, int] | None:
    """(device, first byte, past the last byte) of ``tensor``'s elements; None for None, an empty or a meta tensor.
    A contiguous tensor's is its bytes (``nbytes``, no walk over its strides: the case of every call's error
    buffers, and of most inputs)."""
    if tensor is None or tensor.numel() == 0 or tensor.is_meta:
        return None
    start = tensor.data_ptr()
    if tensor.is_contiguous():
        return tensor.device, start, start + tensor.nbytes
    last = sum((size - 1) * stride for size, stride in zip(tensor.shape, tensor.stride()))
    return tensor.device, start, start + (last + 1) * tensor.element_size()
