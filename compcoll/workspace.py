"""Scratch buffers one owner (a plan, an optimizer) reuses across its calls, so hot paths allocate nothing."""

from __future__ import annotations

from typing import Sequence

import torch


class Workspace:
    """Named scratch buffers of one owner; contents are undefined between uses (but its ``constant``s').

    An owner's calls run one at a time (a plan's on its communicator's ordering, an
    optimizer's in its step), so they may share a buffer; on CUDA, calls queued on
    different streams could overlap on the device, so each stream gets its own.
    """

    def __init__(self) -> None:
        self._buffers: dict[tuple[str, torch.dtype, torch.device, int], tuple[torch.Tensor, dict[int, torch.Tensor]]]
        self._buffers = {}
        self._parts: dict[tuple[str, tuple[int, ...], torch.dtype, torch.device], tuple[torch.Tensor, ...]] = {}
        self._constants: dict[tuple[str, torch.dtype, torch.device], torch.Tensor] = {}

    def get(self, name: str, numel: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        """A 1-D tensor of ``numel`` elements named ``name``.

        1. Look up the buffer kept for (name, dtype, device, CUDA stream), and the view of its first ``numel``
           elements made before (a view costs about a microsecond of torch's dispatch a call).
        2. Grow it (never shrink) when it is smaller than ``numel``, its old views dropped.
        3. Return the view of its first ``numel`` elements, made once and kept.
        """
        stream = current_stream(device.index) if device.type == "cuda" else 0
        key = (name, dtype, device, stream)
        kept = self._buffers.get(key)
        if kept is not None:
            view = kept[1].get(numel)
            if view is not None:
                return view
        if kept is None or kept[0].numel() < numel:
            kept = self._buffers[key] = (torch.empty(numel, dtype=dtype, device=device), {})
        buf, views = kept
        view = views[numel] = buf if buf.numel() == numel else buf[:numel]
        return view

    def parts(self, name: str, sizes: tuple[int, ...], dtype: torch.dtype, device: torch.device
              ) -> tuple[torch.Tensor, ...]:
        """The buffer ``name`` of sum(``sizes``) elements (``get``), then its consecutive views of ``sizes`` elements.

        The views are made once and kept while ``get`` hands out the same buffer (a view costs about a
        microsecond of torch's dispatch: this is for hot paths that split a small buffer on every call).
        """
        whole = self.get(name, sum(sizes), dtype, device)
        key = (name, sizes, dtype, device)
        kept = self._parts.get(key)
        if kept is None or kept[0] is not whole:
            kept = self._parts[key] = (whole, *whole.split(sizes))
        return kept

    def constant(self, name: str, values: Sequence[int], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        """The 1-D tensor ``name`` on ``device`` holding ``values``, made at its first use (one copy to the device)
        and kept: the owner's numbers that never change (a plan's ranks), which kernels read from device memory.
        Never written after, so every stream shares it; ``values`` are read only to make it (the same at every
        call with this name)."""
        key = (name, dtype, device)
        kept = self._constants.get(key)
        if kept is None:
            kept = self._constants[key] = torch.tensor(list(values), dtype=dtype, device=device)
        return kept

    def nbytes(self) -> int:
        """Bytes held (for tests and memory reports)."""
        return sum(b.numel() * b.element_size() for b, _ in self._buffers.values()) + sum(
            c.numel() * c.element_size() for c in self._constants.values())


class Temporaries:
    """The CUDA kernels' temporaries of one thread on one stream, kept from one kernel call to the next.

    A kernel call asks for its temporaries in the same order each time (``kernels.cuda``'s
    ``empty`` argument). The i-th temporary of a dtype is kept and handed out again to the
    next call, grown (never shrunk) when it is too small: no allocation on a steady path.
    Reuse is safe because kernels of one stream run one after another and one thread
    queues its calls in order, so every kernel of a call has run before the next call's
    do; no temporary outlives its call (a sum read back is read before it returns).
    """

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self._kept: dict[tuple[int, torch.dtype], tuple[torch.Tensor, dict[int, torch.Tensor]]] = {}
        self._taken: dict[torch.dtype, int] = {}

    def start(self) -> None:
        """Begin a kernel call: its first request of each dtype gets the first temporary again."""
        self._taken.clear()

    def get(self, numel: int, dtype: torch.dtype) -> torch.Tensor:
        """The next temporary of ``dtype`` in this call, ``numel`` elements (1-D, contiguous).

        1. Number the request: the how-many-th of its dtype in this call.
        2. Hand out the view of ``numel`` elements kept for that number.
        3. Otherwise cut one from the buffer kept for that number (a new, larger buffer
           where it is smaller, its old views dropped) and keep it.
        """
        index = self._taken.get(dtype, 0)
        self._taken[dtype] = index + 1
        kept = self._kept.get((index, dtype))
        if kept is not None and numel in kept[1]:
            return kept[1][numel]
        if kept is None or kept[0].numel() < numel:
            kept = self._kept[(index, dtype)] = (torch.empty(numel, dtype=dtype, device=self.device), {})
        buf, views = kept
        view = views[numel] = buf if buf.numel() == numel else buf[:numel]
        return view


def current_stream(device: int | None) -> int:
    """The handle of torch's current CUDA stream on GPU ``device`` (None: the current GPU), through torch's raw
    getter where it has one (a stream object costs about 5 us)."""
    if device is None:
        device = torch.cuda.current_device()
    raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    return raw(device) if raw is not None else torch.cuda.current_stream(device).cuda_stream
