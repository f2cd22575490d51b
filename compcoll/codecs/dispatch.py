"""The codecs' device dispatch: kernel views of torch tensors, each kernel call sent to its device's kernels.

A CPU tensor's kernels are ``kernels.cpu``'s on numpy views; a CUDA tensor's ``kernels.cuda``'s on
``kernels.arrays.DeviceArray`` views, queued on torch's current stream through ``kernels.launch``; a meta tensor's
the CUDA kernels on ``kernels.launch.TRACED``, counted and not run; a CPU tensor's while
``kernels.launch.simulating()``, the CUDA kernels under numba's simulator. Every view is zero-copy.
"""

from __future__ import annotations

import math
import threading
from functools import lru_cache
from types import ModuleType
from typing import Any, Callable, Union

import numpy as np
import torch

from ..kernels import cpu as cpu_kernels
from ..kernels.arrays import DeviceArray
from ..kernels.launch import (SIMULATED_DEVICE, TRACED, context_for, read_first, read_values, simulating,
                              stream_on)
from ..workspace import Temporaries, current_stream

SUPPORTED_DTYPES = (torch.float32, torch.float16, torch.bfloat16)

Scalar = Union[float, torch.Tensor]
"""A sum or a scale: a float, or (on CUDA: ``scale_from`` of a device sum, ``accumulate_scale``) a one-element tensor
kept on the device."""
KernelView = Union[np.ndarray, DeviceArray]
"""What a kernel takes for a tensor: a numpy view of a host tensor, a ``DeviceArray`` of a device (or meta) one."""
Stream = Any
"""The kernels' stream: numba's stream object for a GPU's, 0 on the host, ``TRACED`` for meta tensors."""

_TORCH_DTYPES = {np.dtype(np.float32): torch.float32, np.dtype(np.float64): torch.float64}

_EMPTY_HOST = np.empty(0, dtype=np.float32)

_FLOAT32 = np.dtype(np.float32)


@lru_cache(maxsize=None)
def lookup_table(dtype: torch.dtype) -> np.ndarray:
    """Exact float32 value of every 16-bit pattern of ``dtype``."""
    patterns = torch.arange(65536, dtype=torch.int32).to(torch.int16)
    return patterns.view(dtype).float().numpy()


@lru_cache(maxsize=None)
def _device_lookup_table(dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """The lookup table of ``dtype`` kept on a CUDA device."""
    return torch.from_numpy(lookup_table(dtype)).to(device)


def check_device(tensor: torch.Tensor, carries_meta: bool = True) -> None:
    """Raise ValueError for a device that has no kernels: CPU and CUDA have; meta, where the communicator carries meta
    tensors (``Communicator.carries_meta``: one rank, the in-process world), traces CUDA's (every launch counted,
    none run)."""
    if tensor.device.type in ("cpu", "cuda") or (tensor.is_meta and carries_meta):
        return
    raise ValueError(f"compcoll: tensors on {tensor.device} are not supported by this communicator; use CPU or CUDA "
                     "tensors (meta tensors, on one rank or an in-process world, count the CUDA path's launches)")


def on_host(tensor: torch.Tensor) -> bool:
    """Whether ``tensor``'s codecs take the CPU kernels: a CPU tensor, unless ``kernels.launch.simulating()``."""
    return tensor.is_cpu and not simulating()


def view(tensor: torch.Tensor) -> KernelView:
    """A zero-copy kernel view: numpy for CPU tensors, a ``kernels.arrays.DeviceArray`` for device tensors."""
    if on_host(tensor):
        return tensor.detach().numpy() if tensor.requires_grad else tensor.numpy()
    # pointer, shape and strides only: the kernels run on torch's current stream, behind the producer
    return DeviceArray.of(tensor)


def no_source(like: torch.Tensor) -> KernelView:
    """An empty float32 kernel view on ``like``'s device: the source slot of a kernel that reads only its error
    (on a device, at ``like``'s address; no torch view made)."""
    return _EMPTY_HOST if on_host(like) else DeviceArray(like.data_ptr(), (0,), (4,), _FLOAT32, like)


def source_of(tensor: torch.Tensor) -> tuple[KernelView, KernelView | None]:
    """A flat kernel view of ``tensor`` (a contiguous copy where it is not contiguous) and the lookup table its dtype
    needs (or None)."""
    host = on_host(tensor)
    if host and tensor.dtype == torch.float32:
        return view(tensor).reshape(-1), None
    if not host:
        if not tensor.is_contiguous():
            tensor = tensor.detach().contiguous()
        if tensor.dtype == torch.float32:
            return DeviceArray.flat(tensor), None
        return DeviceArray.flat(tensor, np.uint16), view(_device_lookup_table(tensor.dtype, tensor.device))
    raw = tensor.detach().reshape(-1).view(torch.int16)
    return raw.numpy().view(np.uint16), lookup_table(tensor.dtype)


def storage_of(tensor: torch.Tensor) -> KernelView:
    """A writable flat kernel view of a contiguous output tensor (16-bit types as raw int16)."""
    if on_host(tensor) or not tensor.is_contiguous():
        flat = tensor.view(-1)
        return view(flat if tensor.dtype == torch.float32 else flat.view(torch.int16))
    return DeviceArray.flat(tensor, None if tensor.dtype == torch.float32 else np.int16)


def weights_of(weights: torch.Tensor, out: torch.Tensor) -> KernelView:
    """The kernel view of ``weights`` as float32 on ``out``'s device (copied only if they are not)."""
    if weights.dtype != torch.float32 or weights.device != out.device:
        weights = weights.to(device=out.device, dtype=torch.float32)
    return view(weights)


def base_of(base: torch.Tensor | None, out: torch.Tensor, out_view: KernelView) -> KernelView | None:
    """The kernel view of an accumulation's ``base``: None, ``out_view`` when it is ``out`` itself, else its own."""
    if base is None:
        return None
    return out_view if base is out else view(base)


def result_into(out: torch.Tensor | None, shape: tuple[int, ...], dtype: torch.dtype, device: torch.device
                ) -> torch.Tensor:
    """A codec's result: the caller's ``out`` (that many elements, 1-D) seen as ``shape``, or a new tensor."""
    if out is None:
        return torch.empty(shape, dtype=dtype, device=device)
    return out if len(shape) == 1 else out.view(shape)


RAW = {torch.float32: (torch.int32, np.uint32, 1 << 31), torch.float16: (torch.int16, np.uint16, 1 << 15),
       torch.bfloat16: (torch.int16, np.uint16, 1 << 15)}
"""Per output dtype: the torch and numpy integer types of its raw bits, and its sign bit."""

_WITH_TEMPORARIES = ("compensated_power_sum", "accumulate_signs", "row_absmax", "tree_sum", "code_blocks",
                     "segment_sumsq")

UNREAD = object()
"""``call``'s ``into`` for a device sum nobody reads: one of the kernel's temporaries."""

_CPU_KERNELS = threading.Lock()


def call(kernel: str, tensor: torch.Tensor, *args: Any, **options: Any) -> Any:
    """Call ``kernel`` of the kernel module for ``tensor``'s device (CUDA: on torch's current stream).

    CPU kernels run one at a time in the process (Numba's workqueue threads are not
    re-entrant), each on all of Numba's threads (serially below ``serial_below()`` elements' worth of work:
    ``kernels.cpu.runs_serially``), with the GIL released.

    CUDA kernels run in the context of ``tensor``'s GPU, whichever GPU is Numba's current
    one, and those that need temporaries take them from this thread's ``Temporaries`` of
    that stream (kept from call to call: no allocation; numba's own allocator would
    cudaMalloc and free them on every call).

    Meta tensors take the CUDA kernels' path on the ``TRACED`` stream: every launch and
    host wait is counted, none is run. ``into=UNREAD`` puts a sum nobody reads into one of
    the kernel's temporaries.
    """
    if on_host(tensor):
        with _CPU_KERNELS:
            serial = cpu_kernels.runs_serially(kernel, tensor.numel(), args)
            run = cpu_kernels.SERIAL[kernel] if serial else getattr(cpu_kernels, kernel)
            return run(*args)
    check_device(tensor)
    run = getattr(_cuda_kernels(), kernel)
    stream = stream_of(tensor)
    extra = {"empty": temporaries(tensor.device, stream)} if kernel in _WITH_TEMPORARIES else {}
    if options.get("into") is UNREAD:
        options["into"] = extra["empty"](1, np.float64, stream)
    if stream is TRACED:
        return run(*args, stream=stream, **extra, **options)
    with context_for(SIMULATED_DEVICE if tensor.is_cpu else tensor.device.index):
        return run(*args, stream=stream, **extra, **options)


def start_cpu_threads() -> None:
    """Start the CPU kernels' worker threads (Numba's) from the calling thread, unless they have started.

    A thread keeps the CPU affinity of the thread that starts it: ``launcher.run_threads``,
    before it keeps its ranks on one CPU (``one_cpu=True``), calls this, so that the
    kernels' threads keep every CPU the process may use.
    """
    with _CPU_KERNELS:
        cpu_kernels.compensated_power_sum(_EMPTY_HOST, None, np.zeros(1, np.float32), 0, 2)


def stream_of(tensor: torch.Tensor) -> Stream:
    """The kernels' stream for a device tensor: numba's view of torch's current stream on its GPU; ``TRACED`` for
    a meta tensor."""
    if tensor.is_meta:
        return TRACED
    if tensor.is_cpu:
        return 0
    device = tensor.device.index
    return numba_stream(device, current_stream(device))


@lru_cache(maxsize=None)
def _cuda_kernels() -> ModuleType:
    """``kernels.cuda``, imported at the first device call (it imports numba.cuda)."""
    from ..kernels import cuda

    return cuda


@lru_cache(maxsize=None)
def numba_stream(device: int, handle: int) -> Stream:
    """numba's view of the CUDA stream ``handle`` on GPU ``device``, made once (a new one per call would cost each
    launch a new launch configuration)."""
    return stream_on(device, handle)


def temporaries(device: torch.device, stream: Stream) -> Callable[[int, Any, Stream], DeviceArray]:
    """The kernels' allocator for one call on ``stream``: (size, numpy dtype, stream) -> a device view of the next
    of this thread's ``Temporaries`` of that stream (made at its first call)."""
    kept = thread_table("temporaries")
    temporaries = kept.get((device, stream))
    if temporaries is None:
        temporaries = kept[(device, stream)] = Temporaries(device)
    temporaries.start()

    def empty(size: int, dtype: Any, stream: Stream) -> DeviceArray:
        return DeviceArray.flat(temporaries.get(size, _TORCH_DTYPES[np.dtype(dtype)]))

    return empty


_THREAD = threading.local()
"""Each thread's tables (``thread_table``): its ``Temporaries`` per (device, stream), its device scalars."""


def thread_table(name: str) -> dict:
    """This thread's table ``name`` (made empty at its first use)."""
    table = getattr(_THREAD, name, None)
    if table is None:
        table = {}
        setattr(_THREAD, name, table)
    return table


FINITE_CHUNK = 1 << 20
"""Elements ``host_finite`` tests at a time: its temporary of one byte an element stays at 1 MiB."""
BFLOAT16_EXPONENT = 0x7F80
"""A bfloat16's exponent bits (all set: Inf or NaN), as its int16 bits hold them."""


def host_finite(values: torch.Tensor) -> bool:
    """Whether every element of the CPU tensor ``values`` is finite.

    1. float16, float32, float64: numpy's ``isfinite`` on a view of the values, ``FINITE_CHUNK`` at a time (one
       pass; ``torch.isfinite(...).all()`` on the CPU is five operators, four passes and their temporaries: 13.7
       against 2.8 us at 4096 float32 elements, 1.5-2.2 ms against 86-90 us at 1M, 45-78 against 4.5 ms at 16M, on
       one and two threads).
    2. bfloat16: its bits as int16, no element's exponent bits all set (an Inf or NaN's), by numpy.
    3. Any other dtype: torch's ``isfinite``.
    """
    flat = values.detach().reshape(-1)
    if flat.dtype == torch.bfloat16:
        bits = flat.view(torch.int16).numpy()
        return all(int((bits[i:i + FINITE_CHUNK] & BFLOAT16_EXPONENT).max(initial=0)) != BFLOAT16_EXPONENT
                   for i in range(0, bits.size, FINITE_CHUNK))
    if flat.dtype not in (torch.float16, torch.float32, torch.float64):
        return bool(torch.isfinite(flat).all())
    array = flat.numpy()
    return all(np.isfinite(array[i:i + FINITE_CHUNK]).all() for i in range(0, array.size, FINITE_CHUNK))


def flag_finite(values: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """out[0] (one float64 of a CPU tensor) <- 0.0 where every element of the CPU tensor ``values`` is finite
    (``host_finite``), else NaN: the host's finite test beside a device's (``sums.finite_sum``, and the folds that
    write theirs in their own launch); returns ``out``."""
    out.numpy()[0] = 0.0 if host_finite(values) else math.nan
    return out


def call_flagged(kernel: str, tensor: torch.Tensor, values: torch.Tensor, finite: torch.Tensor | None,
                 *args: Any) -> None:
    """``call`` ``kernel`` for ``tensor`` on ``args`` into ``values`` (its last argument), and finite[0] <- 0.0 where
    every value is finite, else NaN (where ``finite`` is given): on a device in the kernel's own launch (the folds
    that take ``finite``: ``kernels.cuda.blocks._staged_fold``, ``randomized._absmax_lanes``), on the host after it
    (``flag_finite``)."""
    if finite is not None and not on_host(tensor):
        call(kernel, tensor, *args, view(values), finite=view(finite))
        return
    call(kernel, tensor, *args, view(values))
    if finite is not None:
        flag_finite(values, finite)


def host_value(values: torch.Tensor) -> float:
    """values[0] as a Python float: on a device the host waits for it (``kernels.launch.read_first``, counted; meta
    tensors: the stand-in 1.0)."""
    if on_host(values):
        return float(values.numpy()[0])
    return read_first(view(values), stream_of(values))


def host_values(values: torch.Tensor) -> list[float] | None:
    """Every element of the 1-D ``values`` as Python floats, in one copy: on a device the host waits for them
    (``kernels.launch.read_values``, counted); meta tensors: None (nothing ran)."""
    if on_host(values):
        return values.tolist()
    return read_values(view(values), stream_of(values))


def pinned_like(out: torch.Tensor) -> torch.Tensor:
    """A host tensor of ``out``'s length and dtype in fresh pinned memory, to fill and copy into the CUDA tensor ``out``
    with ``to_device``.

    Fresh from torch's caching host allocator, which keeps each block until the copies out of it have run, so no
    fill meets a copy still reading it (a kept pinned buffer, refilled every call, could). Until 2026-12-05 a
    pageable host tensor was staged by ``pin_memory`` at every upload (a check, an allocation and a host copy: 17 us
    a call on the H200 at f15d93e, ``bench/results/gpu_host_profile_h200_f15d93e.txt``).
    """
    return torch.empty(out.numel(), dtype=out.dtype, pin_memory=True)


def to_device(values: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """A small host tensor (the scales from an agreement) copied into ``out`` on its device; returns ``out``.

    1. On CUDA: queued on the current stream with no host wait where ``values`` is pinned memory
       (``pinned_like``'s, as every caller in compcoll passes; the allocator keeps the block until the
       copy has run). From pageable memory the copy is still correct, but waits for the stream.
    2. Elsewhere: ``out.copy_(values)``.
    """
    if out.device.type != "cuda":
        return out.copy_(values)
    return out.copy_(values, non_blocking=True)


def device_scalar(like: torch.Tensor, value: float) -> torch.Tensor:
    """A 0-dim tensor of ``like``'s dtype on its device holding ``value`` (rounded to that dtype), to divide or
    multiply by on the device: this thread's one for that dtype, device and stream, filled now (allocated at its
    first use only; the fill is queued on the stream before whatever reads it, and the next fill after)."""
    kept = thread_table("scalars")
    stream = current_stream(like.device.index) if like.is_cuda else 0
    key = (like.dtype, like.device, stream)
    slot = kept.get(key)
    if slot is None:
        slot = kept[key] = torch.empty((), dtype=like.dtype, device=like.device)
    return slot.fill_(value)
