"""Scratch buffers reused across calls, so hot paths allocate nothing per call."""

from __future__ import annotations

import threading

import torch

_buffers: dict[tuple[str, torch.device, torch.dtype, int, int], torch.Tensor] = {}


def scratch(name: str, numel: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A 1-D tensor of ``numel`` elements named ``name``; contents are undefined.

    1. Look up the buffer kept for (name, device, dtype, thread, CUDA stream): calls
       made by one thread on one stream run in order, so they may share it; another
       thread (a communicator's ordering thread) or stream gets its own.
    2. Grow it (never shrink) when it is smaller than ``numel``.
    3. Return a view of its first ``numel`` elements.
    """
    device = torch.device(device)
    stream = torch.cuda.current_stream(device).cuda_stream if device.type == "cuda" else 0
    key = (name, device, dtype, threading.get_ident(), stream)
    buf = _buffers.get(key)
    if buf is None or buf.numel() < numel:
        buf = torch.empty(numel, dtype=dtype, device=device)
        _buffers[key] = buf
    return buf[:numel]
