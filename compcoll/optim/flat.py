"""An optimizer's trained parameters as one flat float32 buffer of master weights, their gradients beside it."""

from __future__ import annotations

import sys
import zlib
from dataclasses import dataclass
from types import FunctionType

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
    """The trained parameters of every group, laid out group after group in one flat float32 buffer.

    1. A parameter with ``requires_grad=False`` when the optimizer is built is frozen: it
       stays in its group but out of the buffer, so no step reads or changes it (no weight
       decay, no state, no bytes), as torch's optimizers leave a parameter without a
       gradient. The trained ones must be dense float32, float16 or bfloat16 tensors, all
       on one device, CPU or CUDA (``DEVICE_TYPES``); every buffer lives there too.
    2. Copy the trained parameters, in group order, into ``data`` (float32): their master
       weights, which the optimizer steps. Every parameter keeps its own storage, and
       ``write_back`` copies its master into it after every change (one multi-tensor copy:
       exact for float32, rounded to nearest even for 16-bit ones, as torch's ``copy_``
       does). Parameters that were views of one buffer would be one storage to tools that
       find tied weights by storage: Accelerate's ``save_state`` (safetensors) kept only
       the first of them and dropped the others, logging a line.
    3. ``gather_grads`` copies every trained ``p.grad`` into ``grad`` as float32 (exact for
       16-bit gradients; zeros where a parameter has no gradient), so an optimizer step
       reads one contiguous vector.
    4. ``rebind`` follows what a framework (or the caller) did to the parameters since the
       last step (moved them, assigned ``param.data``, loaded or wrote values in place,
       changed their dtype), so the next step trains them as they are; a parameter frozen
       or unfrozen since is refused, as the buffer's layout cannot change between steps
       (parameters the optimizer does not hold join through its ``add_param_group``, which
       lays them out anew).

    Attributes:
        data: the flat parameter buffer (the master weights).
        grad: the flat gradient buffer, filled by ``gather_grads``.
        params: every parameter of the groups, frozen ones included, in order.
        trained: the indices into ``params`` of the trained parameters, in order.
        trained_params: those parameters, in the order of ``segments``.
        segments: one ``Segment`` per trained parameter, in order.
        bounds: where each segment starts, then where the last ends (``codecs.segment_sumsq``'s bounds).
        groups: (start, stop) of each parameter group.
        low_precision: the 16-bit parameters and their segments (whose masters hold more than they do).
    """

    def __init__(self, param_groups: list[dict], what: str) -> None:
        params = [p for group in param_groups for p in group["params"]]
        if not params:
            raise ValueError(f"{what}: got no parameters to optimize")
        self.trained = [i for i, p in enumerate(params) if p.requires_grad]
        if not self.trained:
            raise ValueError(f"{what}: none of its {len(params)} parameters requires a gradient "
                             f"(requires_grad=False: frozen), so it has nothing to train")
        trained = [params[i] for i in self.trained]
        device = _checked(trained, what)
        if _built_by_zero():
            raise ValueError(
                f"{what}: built by torch's ZeroRedundancyOptimizer, which gives each rank its own shard of the "
                f"parameters: where the shards are alike in shape, the ranks would average different parameters' "
                f"gradients and rank 0's shard would overwrite the others' at construction, with nothing said. "
                f"compcoll's optimizers hold every parameter on every rank (as DeepSpeed's 1-bit optimizers need ZeRO "
                f"off): use the optimizer itself (under DDP with compcoll.ddp.local_hook, or without DDP)")
        self.shapes = [tuple(p.shape) for p in trained]
        self.dtypes = [str(p.dtype) for p in trained]
        self.segments: list[Segment] = []
        self.groups: list[tuple[int, int]] = []
        start = 0
        for index, group in enumerate(param_groups):
            first = start
            for p in group["params"]:
                if p.requires_grad:
                    self.segments.append(Segment(start, p.numel(), index))
                    start += p.numel()
            self.groups.append((first, start))
        self.numel = start
        self.bounds = tuple(seg.start for seg in self.segments) + (start,)
        self.params = params
        self.trained_params = trained
        self.data = torch.empty(self.numel, dtype=torch.float32, device=device)
        self.grad = torch.zeros(self.numel, dtype=torch.float32, device=device)
        for p, seg in zip(trained, self.segments):
            self.data[seg.start:seg.stop].copy_(p.detach().reshape(-1))
        self._bind()
        self._marks = [_mark(p) for p in self.params]

    @property
    def device(self) -> torch.device:
        """The device of the parameters, the flat buffers and every optimizer state buffer."""
        return self.data.device

    def layout_code(self) -> int:
        """A checksum of the group sizes, the trained parameters' shapes and dtypes and which are frozen (none: the
        checksum of a layout without frozen parameters), for checking that ranks and checkpoints agree."""
        frozen = sorted(set(range(len(self.params))) - set(self.trained))
        layout = (self.groups, self.shapes, self.dtypes) + ((tuple(frozen),) if frozen else ())
        return zlib.crc32(repr(layout).encode())

    def write_back(self) -> None:
        """Copy the master weights into the trained parameters (rounded for 16-bit ones), in one multi-tensor copy;
        then mark the 16-bit ones again, so that only a later change of theirs is read back (``rebind``)."""
        with torch.no_grad():
            torch._foreach_copy_(self.trained_params, self._masters)
        if self.low_precision:  # their versions moved; float32 parameters' marks (pointers) did not
            self._marks = [_mark(p) for p in self.params]

    def rebind(self, params: list[torch.Tensor], what: str) -> bool:
        """Follow what was done to the parameters since the last step; whether their device changed.

        ``params`` are the optimizer's parameters now (its groups, flattened).
        1. Check that they are the parameters it was built with, each trained or frozen as
           then, the trained ones each of its old shape and a supported dtype, all on one
           device: re-binding could not be exact otherwise, so ValueError (TypeError for a
           dtype) names what changed.
        2. If that device is not the buffers' (CPU <-> CUDA, another GPU), move ``data``
           and ``grad`` there.
        3. Every 16-bit parameter whose storage changed (``.to()``, ``param.data = ...``, a
           dtype change) or that was written in place (``load_state_dict``) is read back:
           its master takes the parameter's value, as an optimizer built now would, except
           where the parameter kept its dtype and holds exactly the rounding of its master
           (a move, the same values assigned): a 16-bit model's master then keeps its
           float32 bits, as an optimizer built now would after ``load_state_dict``.
        4. Read every float32 parameter into its master (one multi-tensor copy), whatever
           changed: an edit through ``p.data`` moves no version counter, and a float32
           master holds nothing more than its parameter.
        Beyond that copy, nothing is copied when nothing changed: one pointer (and, for 16-bit
        parameters, version) check per parameter.
        """
        if len(params) == len(self.params) and all(p is q and _mark(p) == mark
                                                   for p, q, mark in zip(params, self.params, self._marks)):
            self._read_float32()
            return False
        if len(params) != len(self.params) or any(p is not q for p, q in zip(params, self.params)):
            more = len(params) > len(self.params) and all(p is q for p, q in zip(params, self.params))
            raise ValueError(f"{what}: its parameter groups no longer hold the parameters it was built with (one "
                             f"flat buffer holds them); " + (
                                 "parameters join through add_param_group, not by assigning param_groups (as "
                                 "Lightning's BaseFinetuning does when it resumes)" if more else
                                 SHARDED_SINCE if any(_is_dtensor(p) for p in params) else
                                 "build a new optimizer for the new parameters"))
        trained = set(self.trained)
        for index, p in enumerate(params):
            if p.requires_grad != (index in trained):
                was, now = ("trained", "frozen") if index in trained else ("frozen", "trained")
                raise ValueError(
                    f"{what}: parameter {index} (shape {tuple(p.shape)}) was {was} when the optimizer was built and "
                    f"is {now} now (requires_grad={p.requires_grad}); the parameters it trains are fixed when it is "
                    f"built (one flat buffer holds them): set requires_grad back, or build a new optimizer (parameters "
                    f"left out of it can join later through add_param_group, in every rank's same call)")
        params = self.trained_params
        for index, p, shape in zip(self.trained, params, self.shapes):
            if tuple(p.shape) != shape:
                raise ValueError(f"{what}: parameter {index} changed shape from {shape} to {tuple(p.shape)} since "
                                 f"the optimizer was built; build a new optimizer for the new shapes")
        device = _checked(params, what)
        moved = device != self.data.device
        if moved:
            self.data, self.grad = self.data.to(device), self.grad.to(device)
        marks = [self._marks[i] for i in self.trained]
        with torch.no_grad():
            for p, seg, mark, dtype in zip(params, self.segments, marks, self.dtypes):
                master = self.data[seg.start:seg.stop]
                if p.dtype == torch.float32 or (_mark(p) == mark and not moved):
                    continue  # float32 ones are read in step 4
                value = p.detach().reshape(-1)
                if str(p.dtype) != dtype or not torch.equal(value, master.to(p.dtype)):
                    master.copy_(value)
        self.dtypes = [str(p.dtype) for p in params]
        self._bind()
        self._marks = [_mark(p) for p in self.params]
        self._read_float32()
        return moved

    def _read_float32(self) -> None:
        """Copy every float32 trained parameter into its master (``rebind``'s step 4)."""
        if self._float32:
            with torch.no_grad():
                torch._foreach_copy_([master for _, master in self._float32], [p for p, _ in self._float32])

    def gather_grads(self) -> torch.Tensor:
        """Copy every trained parameter's gradient into ``grad`` (zeros for None) and return it: one multi-tensor
        copy (``torch._foreach_copy_``: a few launches on CUDA, not one a parameter), exact for 16-bit gradients."""
        into, grads = [], []
        for p, view in zip(self.trained_params, self._grad_views):
            if p.grad is None:
                view.zero_()
            elif p.grad.is_sparse:
                raise ValueError(
                    f"the gradient of a parameter of shape {tuple(p.shape)} is sparse; compcoll's optimizers "
                    f"need dense gradients (e.g. torch.nn.Embedding(..., sparse=False))"
                )
            else:
                into.append(view)
                grads.append(p.grad)
        if into:
            torch._foreach_copy_(into, grads)
        return self.grad

    def views(self, flat: torch.Tensor) -> list[tuple[Segment, torch.Tensor]]:
        """(segment, slice of ``flat``) for every parameter: per-layer views of a flat state buffer."""
        return [(seg, flat[seg.start:seg.stop]) for seg in self.segments]

    def _bind(self) -> None:
        """List the 16-bit parameters; make the views of ``data`` (the masters) and of ``grad`` each trained
        parameter is copied from and into."""
        self.low_precision = [(p, seg) for p, seg in zip(self.trained_params, self.segments)
                              if p.dtype != torch.float32]
        self._masters = [self.data[seg.start:seg.stop].view_as(p) for p, seg in zip(self.trained_params, self.segments)]
        self._float32 = [(p, master) for p, master in zip(self.trained_params, self._masters)
                         if p.dtype == torch.float32]
        self._grad_views = [self.grad[seg.start:seg.stop].view_as(p)
                            for p, seg in zip(self.trained_params, self.segments)]


SHARDED_SINCE = ("they are DTensors now: FSDP2 or tensor parallelism sharded the model after the optimizer was built "
                 "(Accelerate's prepare does under FSDP2, switching the optimizer's parameters to the shards); "
                 "compcoll's optimizers average whole local gradients themselves, so they take unsharded parameters: "
                 "under FSDP2 use AdamW with compcoll.fsdp.compress (docs/guides/fsdp.md)")
"""Why an optimizer's parameters changed, where the new ones are DTensors."""


def _mark(p: torch.Tensor) -> tuple[int, int, bool]:
    """What changes when a parameter's storage is replaced or, for a 16-bit one, written, or when it is frozen or
    unfrozen: (pointer, version, requires_grad); a frozen one's is (0, 0, False), whatever is done to it.

    A float32 parameter's version is left out: ``write_back`` moves it every step, and ``rebind`` reads every
    float32 parameter anyway.
    """
    if not p.requires_grad:
        return (0, 0, False)
    return (p.data_ptr(), 0 if p.dtype == torch.float32 else p._version, True)


def _checked(params: list[torch.Tensor], what: str) -> torch.device:
    """The one device of ``params`` once each is a dense float32, float16 or bfloat16 tensor (TypeError or
    ValueError naming the first that is not)."""
    for p in params:
        if p.dtype not in DTYPES:
            raise TypeError(
                f"{what}: parameters must be float32, float16 or bfloat16, got a {p.dtype} parameter of "
                f"shape {tuple(p.shape)}"
            )
        if p.is_sparse:
            raise ValueError(f"{what}: parameters must be dense, got a sparse one of shape {tuple(p.shape)}")
        if _is_dtensor(p):
            raise ValueError(
                f"{what}: a parameter of shape {tuple(p.shape)} is a DTensor (sharded or replicated by FSDP2, or "
                f"split by tensor parallelism); compcoll's optimizers average whole local gradients themselves, so "
                f"they take unsharded parameters: under FSDP2 use AdamW with compcoll.fsdp.compress "
                f"(docs/guides/fsdp.md)")
        if getattr(p, "_is_flat_param", False):
            raise ValueError(
                f"{what}: a parameter of shape {tuple(p.shape)} is FSDP's FlatParameter (FullyShardedDataParallel "
                f"holds one shard of the model's parameters on each rank, alike in shape, so the ranks would "
                f"average different parameters' values); compcoll's optimizers take unsharded parameters: use "
                f"them under DDP, or FSDP2's fully_shard with AdamW and compcoll.fsdp.compress (docs/guides/fsdp.md)")
    return _one_device(params, what)


def _built_by_zero() -> bool:
    """Whether torch's ``ZeroRedundancyOptimizer`` is building the optimizer (as its local optimizer, over this
    rank's shard).

    1. None can exist before its module is imported, so it is not imported here.
    2. Walk the calling frames, once, at construction: one running a method of
       ``ZeroRedundancyOptimizer`` (its code object) means it is.

    The walk reads each frame's code, never its locals: on Python 3.10-3.12, reading
    ``frame.f_locals`` stores a copy of them on the frame, which then kept whatever the caller's
    variables held at that moment (a model, a communicator and its process group) alive until
    that frame returned, though the caller had let go of them.
    """
    module = sys.modules.get("torch.distributed.optim.zero_redundancy_optimizer")
    if module is None:
        return False
    methods = {f.__code__ for f in vars(module.ZeroRedundancyOptimizer).values() if isinstance(f, FunctionType)}
    frame = sys._getframe(1)
    while frame is not None:
        if frame.f_code in methods:
            return True
        frame = frame.f_back
    return False


def _is_dtensor(p: torch.Tensor) -> bool:
    """Whether ``p`` is a ``torch.distributed.tensor.DTensor`` (none can exist before that module is imported, so
    it is not imported here)."""
    module = sys.modules.get("torch.distributed.tensor")
    return module is not None and isinstance(p, module.DTensor)


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
