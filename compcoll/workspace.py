"""Scratch buffers one owner (a plan, an optimizer) reuses across its calls, so hot paths allocate nothing."""

from __future__ import annotations

import torch


class Workspace:
    """Named scratch buffers of one owner; contents are undefined between uses.

    An owner's calls run one at a time (a plan's on its communicator's ordering, an
    optimizer's in its step), so they may share a buffer; on CUDA, calls queued on
    different streams could overlap on the device, so each stream gets its own.
    """

    def __init__(self) -> None:
        self._buffers: dict[tuple[str, torch.dtype, torch.device, int], torch.Tensor] = {}

    def get(self, name: str, numel: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        """A 1-D tensor of ``numel`` elements named ``name``.

        1. Look up the buffer kept for (name, dtype, device, CUDA stream).
        2. Grow it (never shrink) when it is smaller than ``numel``.
        3. Return a view of its first ``numel`` elements.
        """
        stream = current_stream(device.index) if device.type == "cuda" else 0
        key = (name, dtype, device, stream)
        buf = self._buffers.get(key)
        if buf is None or buf.numel() < numel:
            buf = torch.empty(numel, dtype=dtype, device=device)
            self._buffers[key] = buf
        return buf if buf.numel() == numel else buf[:numel]

    def nbytes(self) -> int:
        """Bytes held (for tests and memory reports)."""
        return sum(b.numel() * b.element_size() for b in self._buffers.values())


def current_stream(device: int | None) -> int:
    """The handle of torch's current CUDA stream on GPU ``device`` (None: the current GPU), through torch's raw
    getter where it has one (a stream object costs about 5 us)."""
    if device is None:
        device = torch.cuda.current_device()
    raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    return raw(device) if raw is not None else torch.cuda.current_stream(device).cuda_stream
