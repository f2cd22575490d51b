"""All parameters of an optimizer as views into one flat float32 buffer, and their gradients gathered beside it."""

from __future__ import annotations

import zlib
from dataclasses import dataclass

import torch

DTYPES = (torch.float32, torch.float16, torch.bfloat16)
DEVICE_TYPES = ("cpu", "cuda")

@dataclass(frozen=True)
class Segment:
    """One parameter's place in the flat buffer: elements [start, start + numel), in group ``group``."""

    start: int
    numel: int
    group: int

    @property
    def stop(self) -> int:
        return self.start + self.numel


class FlatParams:
    """The parameters of every group, laid out group after group in one flat float32 buffer.

    1. Check that every parameter is a dense float32, float16 or bfloat16 tensor, all on
       one device, CPU or CUDA (``DEVICE_TYPES``); every buffer lives there too.
    2. Copy them, in group order, into ``data`` (float32). A float32 parameter becomes a
       view of its slice (``p.data = data[slice].view_as(p)``), so the model trains the
       flat buffer. A 16-bit parameter keeps its own storage: ``data`` holds its float32
       master copy, and ``write_back`` rounds the master into it (to nearest even, as
       torch's ``copy_`` does) after every change.
    3. ``gather_grads`` copies every ``p.grad`` into ``grad`` as float32 (exact for
       16-bit gradients; zeros where a parameter has no gradient), so an optimizer step
       reads one contiguous vector.

    Attributes:
        data: the flat parameter buffer (the master weights).
        grad: the flat gradient buffer, filled by ``gather_grads``.
        segments: one ``Segment`` per parameter, in order.
        groups: (start, stop) of each parameter group.
        low_precision: the 16-bit parameters and their segments.
    """

    def __init__(self, param_groups: list[dict], what: str) -> None:
        params = [p for group in param_groups for p in group["params"]]
        if not params:
            raise ValueError(f"{what}: got no parameters to optimize")
        for p in params:
            if p.dtype not in DTYPES:
                raise TypeError(
                    f"{what}: parameters must be float32, float16 or bfloat16, got a {p.dtype} parameter of "
                    f"shape {tuple(p.shape)}"
                )
            if p.is_sparse:
                raise ValueError(f"{what}: parameters must be dense, got a sparse one of shape {tuple(p.shape)}")
        device = _one_device(params, what)
        self.shapes = [tuple(p.shape) for p in params]
        self.dtypes = [str(p.dtype) for p in params]
        self.segments: list[Segment] = []
        self.groups: list[tuple[int, int]] = []
        start = 0
        for index, group in enumerate(param_groups):
            first = start
            for p in group["params"]:
                self.segments.append(Segment(start, p.numel(), index))
                start += p.numel()
            self.groups.append((first, start))
        self.numel = start
        self.params = params
        self.data = torch.empty(self.numel, dtype=torch.float32, device=device)
        self.grad = torch.zeros(self.numel, dtype=torch.float32, device=device)
        self.low_precision: list[tuple[torch.Tensor, Segment]] = []
        for p, seg in zip(params, self.segments):
            view = self.data[seg.start:seg.stop]
            view.copy_(p.detach().reshape(-1))
            if p.dtype == torch.float32:
                p.data = view.view_as(p)
            else:
                self.low_precision.append((p, seg))

    @property
    def device(self) -> torch.device:
        """The device of the parameters, the flat buffers and every optimizer state buffer."""
        return self.data.device

    def layout_code(self) -> int:
        """A checksum of the group sizes, parameter shapes and dtypes, for checking that ranks agree."""
        return zlib.crc32(repr((self.groups, self.shapes, self.dtypes)).encode())

    def write_back(self) -> None:
        """Round the master weights of the 16-bit parameters into them (nothing for float32 ones, which are views)."""
        with torch.no_grad():
            for p, seg in self.low_precision:
                p.copy_(self.data[seg.start:seg.stop].view_as(p))

    def gather_grads(self) -> torch.Tensor:
        """Copy every parameter's gradient into ``grad`` (zeros for None) and return it."""
        for p, seg in zip(self.params, self.segments):
            view = self.grad[seg.start:seg.stop]
            if p.grad is None:
                view.zero_()
            elif p.grad.is_sparse:
                raise ValueError(
                    f"the gradient of a parameter of shape {tuple(p.shape)} is sparse; compcoll's optimizers "
                    f"need dense gradients (e.g. torch.nn.Embedding(..., sparse=False))"
                )
            else:
                view.copy_(p.grad.reshape(-1))
        return self.grad

    def views(self, flat: torch.Tensor) -> list[tuple[Segment, torch.Tensor]]:
        """(segment, slice of ``flat``) for every parameter: per-layer views of a flat state buffer."""
        return [(seg, flat[seg.start:seg.stop]) for seg in self.segments]


def _one_device(params: list[torch.Tensor], what: str) -> torch.device:
    """The one CPU or CUDA device all ``params`` are on; ValueError naming the devices otherwise."""
    devices = sorted({str(p.device) for p in params})
    if len(devices) > 1:
        raise ValueError(
            f"{what}: parameters are on several devices ({', '.join(devices)}); one optimizer takes the "
            f"parameters of one device (its flat buffer lives there): move the model with .to(device) first"
        )
    device = params[0].device
    if device.type not in DEVICE_TYPES:
        raise ValueError(f"{what}: parameters on {device} are not supported; use CPU or CUDA parameters")
    return device
