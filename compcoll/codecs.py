"""Low-bit codecs on torch tensors (scaled sign, binary randomization, uniform levels): dtypes, wire layout, kernels.

The algorithms call only this module; it picks the kernels for the tensor's device (CPU:
``kernels.cpu`` on numpy views; CUDA: ``kernels.cuda`` on ``__cuda_array_interface__``
views, queued on torch's current stream through ``kernels.launch``; meta: the CUDA kernels on
``kernels.launch.TRACED``, counted and not run; CPU tensors while ``kernels.launch.simulating()``:
the CUDA kernels under numba's simulator) and hands them zero-copy views. The wire
layout of a 1-bit chunk is its packed signs (first element in the most significant bit),
preceded, where a scale travels with it, by that scale as 4 native-endian float32 bytes.
"""

from __future__ import annotations

import math
import threading
from functools import lru_cache
from typing import Union

import numpy as np
import torch

from . import spec
from .kernels import cpu as cpu_kernels
from .kernels.launch import (SIMULATED_DEVICE, TRACED, DeviceArray, context_for, read_first, read_values, simulating,
                             stream_on)
from .spec import BLOCK, LANES, SCALE_BYTES
from .workspace import Temporaries, current_stream

SUPPORTED_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
Scalar = Union[float, torch.Tensor]
"""A sum or a scale: a float, or (on CUDA: ``scale_from`` of a device sum, ``accumulate_scale``) a one-element tensor
kept on the device."""
_TORCH_DTYPES = {np.dtype(np.float32): torch.float32, np.dtype(np.float64): torch.float64}
_EMPTY_HOST = np.empty(0, dtype=np.float32)
_FLOAT32 = np.dtype(np.float32)


@lru_cache(maxsize=None)
def _lookup_table(dtype: torch.dtype) -> np.ndarray:
    """Exact float32 value of every 16-bit pattern of ``dtype``."""
    patterns = torch.arange(65536, dtype=torch.int32).to(torch.int16)
    return patterns.view(dtype).float().numpy()


@lru_cache(maxsize=None)
def _device_lookup_table(dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """The lookup table of ``dtype`` kept on a CUDA device."""
    return torch.from_numpy(_lookup_table(dtype)).to(device)


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


def _array(tensor: torch.Tensor):
    """A zero-copy kernel view: numpy for CPU tensors, a ``kernels.launch.DeviceArray`` for device tensors."""
    if on_host(tensor):
        return tensor.detach().numpy() if tensor.requires_grad else tensor.numpy()
    # pointer, shape and strides only: the kernels run on torch's current stream, behind the producer
    return DeviceArray.of(tensor)


def _no_source(like: torch.Tensor):
    """An empty float32 kernel view on ``like``'s device: the source slot of a kernel that reads only its error
    (on a device, at ``like``'s address; no torch view made)."""
    return _EMPTY_HOST if on_host(like) else DeviceArray(like.data_ptr(), (0,), (4,), _FLOAT32, like)


def _source(tensor: torch.Tensor):
    """A flat kernel view of ``tensor`` (a contiguous copy where it is not contiguous) and the lookup table its dtype
    needs (or None)."""
    host = on_host(tensor)
    if host and tensor.dtype == torch.float32:
        return _array(tensor).reshape(-1), None
    if not host:
        if not tensor.is_contiguous():
            tensor = tensor.detach().contiguous()
        if tensor.dtype == torch.float32:
            return DeviceArray.flat(tensor), None
        return DeviceArray.flat(tensor, np.uint16), _array(_device_lookup_table(tensor.dtype, tensor.device))
    raw = tensor.detach().reshape(-1).view(torch.int16)
    return raw.numpy().view(np.uint16), _lookup_table(tensor.dtype)


def _storage(tensor: torch.Tensor):
    """A writable flat kernel view of a contiguous output tensor (16-bit types as raw int16)."""
    if on_host(tensor) or not tensor.is_contiguous():
        flat = tensor.view(-1)
        return _array(flat if tensor.dtype == torch.float32 else flat.view(torch.int16))
    return DeviceArray.flat(tensor, None if tensor.dtype == torch.float32 else np.int16)


_WITH_TEMPORARIES = ("compensated_power_sum", "accumulate_signs", "row_absmax", "tree_sum", "code_blocks",
                     "segment_sumsq")
_UNREAD = object()
"""``_run``'s ``into`` for a device sum nobody reads: one of the kernel's temporaries."""
_CPU_KERNELS = threading.Lock()


def _run(kernel: str, tensor: torch.Tensor, *args, **options):
    """Call ``kernel`` of the kernel module for ``tensor``'s device (CUDA: on torch's current stream).

    CPU kernels run one at a time in the process (Numba's workqueue threads are not
    re-entrant), each on all of Numba's threads (serially below ``SERIAL_BELOW`` elements
    of ``tensor``), with the GIL released.

    CUDA kernels run in the context of ``tensor``'s GPU, whichever GPU is Numba's current
    one, and those that need temporaries take them from this thread's ``Temporaries`` of
    that stream (kept from call to call: no allocation; numba's own allocator would
    cudaMalloc and free them on every call).

    Meta tensors take the CUDA kernels' path on the ``TRACED`` stream: every launch and
    host wait is counted, none is run. ``into=_UNREAD`` puts a sum nobody reads into one of
    the kernel's temporaries.
    """
    if on_host(tensor):
        small = tensor.numel() < cpu_kernels.SERIAL_BELOW
        run = cpu_kernels.SERIAL[kernel] if small else getattr(cpu_kernels, kernel)
        with _CPU_KERNELS:
            return run(*args)
    check_device(tensor)
    run = getattr(_cuda_kernels(), kernel)
    stream = _stream(tensor)
    extra = {"empty": _temporaries(tensor.device, stream)} if kernel in _WITH_TEMPORARIES else {}
    if options.get("into") is _UNREAD:
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


def _stream(tensor: torch.Tensor):
    """The kernels' stream for a device tensor: numba's view of torch's current stream on its GPU; ``TRACED`` for
    a meta tensor."""
    if tensor.is_meta:
        return TRACED
    if tensor.is_cpu:
        return 0
    device = tensor.device.index
    return _numba_stream(device, current_stream(device))


@lru_cache(maxsize=None)
def _cuda_kernels():
    """``kernels.cuda``, imported at the first device call (it imports numba.cuda)."""
    from .kernels import cuda

    return cuda


@lru_cache(maxsize=None)
def _numba_stream(device: int, handle: int):
    """numba's view of the CUDA stream ``handle`` on GPU ``device``, made once (a new one per call would cost each
    launch a new launch configuration)."""
    return stream_on(device, handle)


def _temporaries(device: torch.device, stream):
    """The kernels' allocator for one call on ``stream``: (size, numpy dtype, stream) -> a device view of the next
    of this thread's ``Temporaries`` of that stream (made at its first call)."""
    kept = _thread_table("temporaries")
    temporaries = kept.get((device, stream))
    if temporaries is None:
        temporaries = kept[(device, stream)] = Temporaries(device)
    temporaries.start()

    def empty(size: int, dtype, stream):
        return DeviceArray.flat(temporaries.get(size, _TORCH_DTYPES[np.dtype(dtype)]))

    return empty


_THREAD = threading.local()
"""Each thread's tables (``_thread_table``): its ``Temporaries`` per (device, stream), its device scalars."""


def _thread_table(name: str) -> dict:
    """This thread's table ``name`` (made empty at its first use)."""
    table = getattr(_THREAD, name, None)
    if table is None:
        table = {}
        setattr(_THREAD, name, table)
    return table


def all_finite(tensor: torch.Tensor, summable: bool = False) -> bool:
    """Whether every element of ``tensor`` is finite. On a device, the host waits for the answer: a wait counted
    by ``kernels.launch.read_first`` (meta tensors: counted, and True).

    1. CPU: ``torch.isfinite(tensor).all()``.
    2. CUDA, 32- and 16-bit floats: one reduction, the sum in float64, is finite exactly when every
       element is (an Inf or NaN makes it Inf or NaN; finite ones are below 2^128 each, and
       overflowing float64 would take 2^896 of them). ``torch.isfinite`` alone takes four
       kernels on CUDA. Float64, whose finite values could overflow a sum: the sum of
       ``tensor * 0`` (0 for a finite element, NaN for an Inf or NaN), two kernels; or, where
       the caller knows finite elements cannot overflow their sum (``summable``: the float64
       block sums of |x|^p of float32 x, each below 2^256 times its length), the plain sum.
    """
    if on_host(tensor):
        return bool(torch.isfinite(tensor).all())
    return math.isfinite(host_value(finite_sum(tensor, torch.empty(1, dtype=torch.float64, device=tensor.device),
                                               summable)))


def finite_sum(tensor: torch.Tensor, out: torch.Tensor, summable: bool = False) -> torch.Tensor:
    """out[0] (one float64) <- a value finite exactly when every element of ``tensor`` is, with no host wait
    (``host_value`` reads it; ``all_finite`` is the two); returns ``out``.

    On the host 0 or NaN. On a device the float64 sum of ``tensor`` (of ``tensor * 0`` for float64 that is not
    ``summable``: see ``all_finite``), reduced into ``out`` by torch in place (no allocation, so a replayed call
    runs it again: ``recording.Guard``).
    """
    if on_host(tensor):
        out.numpy()[0] = 0.0 if bool(torch.isfinite(tensor).all()) else math.nan
        return out
    source = tensor if summable or tensor.dtype != torch.float64 else tensor.mul(0)
    return torch.sum(source.reshape(1, -1), 1, dtype=torch.float64, out=out)


def scale_from(total: Scalar, numel: int, scale: str) -> Scalar:
    """The float32 scale of ``numel`` elements from their float64 sum of |x|^p (``spec.scale_from``).

    A float gives a float. A device-resident sum (a one-element float64 CUDA tensor) gives
    a one-element float32 tensor on that device, computed there with the same bits.
    """
    if isinstance(total, torch.Tensor) and not on_host(total):
        out = torch.empty(1, dtype=torch.float32, device=total.device)
        _run("scale_of", total, _array(total), numel, spec.SCALES[scale], _array(out))
        return out
    return float(spec.scale_from(float(total), numel, scale))


def _sum(kernel: str, tensor: torch.Tensor, read: bool, *args, out: torch.Tensor | None = None) -> float | None:
    """Run a kernel that ends in a float64 sum: to the host as a float, or, not ``read`` on a device, left in one of
    the kernel's temporaries (no host round trip, no allocation) and None returned; or into ``out`` (a one-element
    float64 tensor on ``tensor``'s device, read later by ``host_value``: no host wait) and None returned."""
    if out is not None:
        if on_host(tensor):
            out.numpy()[0] = _run(kernel, tensor, *args)
        else:
            _run(kernel, tensor, *args, into=_array(out))
        return None
    if not read and not on_host(tensor):
        _run(kernel, tensor, *args, into=_UNREAD)
        return None
    return float(_run(kernel, tensor, *args))


def divide_(values: torch.Tensor, divisor: float) -> torch.Tensor:
    """values /= divisor in place, correctly rounded on every device (the divisor rounded to the values' dtype).

    torch's CUDA division by a Python number multiplies by its reciprocal (1/3 is not
    exact), so the divisor goes in as a 0-dim tensor on the device (``device_scalar``), which takes the IEEE
    division the CPU and the numpy reference do; on the CPU numpy divides, correctly
    rounded too (as torch's CPU division by a Python number).
    """
    if on_host(values):
        array = values.numpy()
        np.divide(array, array.dtype.type(divisor), out=array)
        return values
    return values.div_(device_scalar(values, divisor))


def device_scalar(like: torch.Tensor, value: float) -> torch.Tensor:
    """A 0-dim tensor of ``like``'s dtype on its device holding ``value`` (rounded to that dtype), to divide or
    multiply by on the device: this thread's one for that dtype, device and stream, filled now (allocated at its
    first use only; the fill is queued on the stream before whatever reads it, and the next fill after)."""
    kept = _thread_table("scalars")
    stream = current_stream(like.device.index) if like.is_cuda else 0
    key = (like.dtype, like.device, stream)
    slot = kept.get(key)
    if slot is None:
        slot = kept[key] = torch.empty((), dtype=like.dtype, device=like.device)
    return slot.fill_(value)


def to_device(values: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """A small host tensor (the scales from an agreement) copied into ``out`` on its device, with no host wait;
    returns ``out``.

    1. On CUDA: copied into pinned memory from torch's caching host allocator, then to the
       device asynchronously on the current stream (the allocator keeps the pinned block
       until that copy has run). A pageable copy waits for the stream.
    2. Elsewhere: ``out.copy_(values)``.
    """
    if out.device.type != "cuda":
        return out.copy_(values)
    return out.copy_(values.pin_memory(), non_blocking=True)


def average_rows(rows: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """out <- the float32 average of the rows of ``rows`` ((n, m) float32): summed in row order, then divided by n,
    in one kernel (``reference.average_rows``'s bits on every device); returns ``out``."""
    _run("average_rows", out, _array(rows), _array(out))
    return out


def compensated_sum(tensor: torch.Tensor, error: torch.Tensor, scale: str = "l2", read: bool = True,
                    out: torch.Tensor | None = None) -> float | None:
    """Sum of |x|^p of x = ``error + pad(tensor)``, p the power of ``scale`` (``spec.SCALES``); reads both, writes
    nothing but ``out``. ``read=False``: on a device the sum is not read back (no host wait) and None is returned, so
    the kernel's device time can be measured queued behind other work (``bench/gpu_suite.py``). ``out``: a
    one-element float64 tensor on the device the sum goes into, None returned (``host_value`` reads it)."""
    src, lut = _source(tensor)
    return _sum("compensated_power_sum", tensor, read, src, lut, _array(error), tensor.numel(), spec.SCALES[scale],
                out=out)


def host_value(values: torch.Tensor) -> float:
    """values[0] as a Python float: on a device the host waits for it (``kernels.launch.read_first``, counted; meta
    tensors: the stand-in 1.0)."""
    if on_host(values):
        return float(values.numpy()[0])
    return read_first(_array(values), _stream(values))


def host_values(values: torch.Tensor) -> list[float] | None:
    """Every element of the 1-D ``values`` as Python floats, in one copy: on a device the host waits for them
    (``kernels.launch.read_values``, counted); meta tensors: None (nothing ran)."""
    if on_host(values):
        return values.tolist()
    return read_values(_array(values), _stream(values))


def sumsq(tensor: torch.Tensor) -> float:
    """Float64 sum of squares of a 1-D float32 tensor, in an order fixed by its length alone.

    The same kernel as ``compensated_sum`` (the tensor in the error slot, no source),
    so the result does not depend on the number of threads: ranks holding the same bits
    compute the same norm.
    """
    return float(_run("compensated_power_sum", tensor, _no_source(tensor), None, _array(tensor), 0, 2))


def segment_sumsq(tensor: torch.Tensor, bounds: tuple[int, ...], out: torch.Tensor) -> None:
    """out[j] (float64, on ``tensor``'s device) <- ``sumsq(tensor[bounds[j]:bounds[j + 1]])``, the same bits, for
    every segment j, in one kernel call (two launches on CUDA, no host wait): the norms of many layers of one flat
    vector without a call per layer.

    ``bounds`` is a tuple of non-decreasing offsets from 0 to at most ``tensor.numel()``; its device tables are
    made once per bounds and device (``_segment_tables``).
    """
    tables, blocks = _segment_tables(bounds, tensor.device)
    _run("segment_sumsq", tensor, _array(tensor), _array(tables[0]), _array(tables[1]), blocks, _array(out))


@lru_cache(maxsize=64)
def _segment_tables(bounds: tuple[int, ...], device: torch.device) -> tuple[torch.Tensor, int]:
    """(int64 rows [bounds, firsts] on ``device``, the summation blocks of all segments): firsts[j] is segment j's
    first block, each segment max(1, ceil(length / BLOCK)) blocks of its own (``compensated_power_sum``'s)."""
    offsets = np.asarray(bounds, dtype=np.int64)
    blocks = np.maximum(1, -(-np.diff(offsets) // BLOCK))
    firsts = np.concatenate([[0], np.cumsum(blocks)]).astype(np.int64)
    return torch.from_numpy(np.stack([offsets, firsts])).to(device), int(firsts[-1])


def compensate_encode(
    tensor: torch.Tensor | None, error: torch.Tensor, scale: Scalar, bits: torch.Tensor
) -> None:
    """bits <- packed sign(error + pad(tensor)); error <- (error + pad(tensor)) - scale * sign.

    ``tensor=None`` encodes ``error`` alone (the server step, where it holds the sum).
    ``scale`` may be a device-resident scale (``scale_from``), which the CUDA kernel reads
    from device memory.
    """
    src, lut = (_no_source(error), None) if tensor is None else _source(tensor)
    n_src = 0 if tensor is None else tensor.numel()
    on_device = isinstance(scale, torch.Tensor) and not on_host(error)
    _run("compensate_encode", error, src, lut, _array(error), n_src,
         _array(scale) if on_device else np.float32(float(scale)), _array(bits))


def accumulate_signs(
    bits: torch.Tensor, weights: torch.Tensor, base: torch.Tensor | None, out: torch.Tensor, count: int,
    scale: str = "l2", read: bool = True,
) -> float | None:
    """out[:count] <- sum_r weights[r] * signs(bits[r]) (+ base); returns its sum of |out|^p (p: ``scale``'s power).

    ``read=False``: on a device the sum is not read back (no host round trip) and None is
    returned; on the CPU it is a float either way.
    """
    return _sum("accumulate_signs", out, read, *_accumulate_args(bits, weights, base, out, count, scale))


def accumulate_groups(bits: torch.Tensor, weights: torch.Tensor, out: torch.Tensor, count: int) -> None:
    """out[:count] <- for each group j of ``weights``' (groups, m): sum_r weights[j, r] * signs of bits row j * m + r,
    into segment j of out (8 elements a byte of a row, so segment j starts at j * 8 * bits.shape[1]), rank by rank in
    float32 as ``accumulate_signs`` sums one group: the averages of several shards in one kernel."""
    _run("accumulate_groups", out, _array(bits), _array(weights), _array(out), count)


def _accumulate_args(bits: torch.Tensor, weights: torch.Tensor, base: torch.Tensor | None, out: torch.Tensor,
                     count: int, scale: str) -> tuple:
    """The kernel arguments of ``accumulate_signs`` and ``accumulate_scale``."""
    out_view = _array(out)
    return _array(bits), _weights(weights, out), _base(base, out, out_view), out_view, count, spec.SCALES[scale]


def accumulate_scale(
    bits: torch.Tensor, weights: torch.Tensor, base: torch.Tensor | None, out: torch.Tensor, count: int, numel: int,
    scale: str = "l2", head: torch.Tensor | None = None,
) -> Scalar:
    """``accumulate_signs``, returning the float32 ``scale`` of ``numel`` elements from its sum (``scale_from``).

    On CUDA the same launch computes the scale and keeps it on the device (a one-element
    float32 tensor); on the CPU it is a float. ``head``, a wire row (uint8, its storage
    4-byte aligned: a buffer of its own), gets the scale in its frame head (``frame``): on
    CUDA the launch writes it there, and the scale returned is that head's float32 view.
    """
    args = _accumulate_args(bits, weights, base, out, count, scale)
    if on_host(out):
        value = scale_from(float(_run("accumulate_signs", out, *args)), numel, scale)
        if head is not None:
            frame(head, value)
        return value
    slot = None if head is None else head[:SCALE_BYTES].view(torch.float32)
    return _device_scale("accumulate_signs", out, numel, scale, *args, slot=slot)


def _device_scale(kernel: str, tensor: torch.Tensor, numel: int, scale: str, *args,
                  slot: torch.Tensor | None = None) -> torch.Tensor:
    """Run a CUDA kernel that ends in a float64 sum, with the float32 scale of ``numel`` elements from it written by
    the same launch into ``slot`` (one float32 element on the device; a new one when None); returns the slot. The sum
    itself goes into one of the kernel's temporaries: nothing reads it."""
    out = torch.empty(1, dtype=torch.float32, device=tensor.device) if slot is None else slot
    _run(kernel, tensor, *args, scale=(numel, spec.SCALES[scale], _array(out)))
    return out


def _weights(weights: torch.Tensor, out: torch.Tensor):
    """The kernel view of ``weights`` as float32 on ``out``'s device (copied only if they are not)."""
    if weights.dtype != torch.float32 or weights.device != out.device:
        weights = weights.to(device=out.device, dtype=torch.float32)
    return _array(weights)


def _base(base: torch.Tensor | None, out: torch.Tensor, out_view):
    """The kernel view of an accumulation's ``base``: None, ``out_view`` when it is ``out`` itself, else its own."""
    if base is None:
        return None
    return out_view if base is out else _array(base)


def lane_count(count: int) -> int:
    """Float64 lane sums ``accumulate_lanes`` writes for ``count`` elements: LANES per BLOCK."""
    return max(1, -(-count // BLOCK)) * LANES


def accumulate_lanes(
    bits: torch.Tensor, weights: torch.Tensor, base: torch.Tensor | None, out: torch.Tensor, count: int,
    lanes: torch.Tensor, scale: str = "l2",
) -> None:
    """``accumulate_signs`` without the final sum: ``lanes`` (float64, ``lane_count(count)``) gets the
    (block, lane) sums of |out|^p, so that BLOCK-aligned pieces can be summed together by ``tree_sum``."""
    out_view = _array(out)
    _run("accumulate_lanes", out, _array(bits), _weights(weights, out), _base(base, out, out_view), out_view, count,
         _array(lanes), spec.SCALES[scale])


def tree_sum(lanes: torch.Tensor) -> float:
    """The pairwise tree sum of float64 lane sums (the last step of every scale's sum)."""
    return float(_run("tree_sum", lanes, _array(lanes)))


def tree_scale(lanes: torch.Tensor, numel: int, scale: str = "l2") -> Scalar:
    """The float32 ``scale`` of ``numel`` elements from the tree sum of their lane sums, as ``accumulate_scale``
    (on CUDA: in the tree's own launch, kept on the device)."""
    if on_host(lanes):
        return scale_from(tree_sum(lanes), numel, scale)
    return _device_scale("tree_sum", lanes, numel, scale, _array(lanes))


def decode(bits: torch.Tensor, scales: torch.Tensor, out: torch.Tensor) -> None:
    """out <- scales[r] * signs(bits[r]) for the rows of ``bits``, cut to out.numel().

    The values +-scale are rounded to the output dtype once (by torch), then selected.
    """
    if on_host(out) and out.dtype == torch.float32 and scales.dtype == torch.float32:
        _decode_host(_array(bits), scales.numpy(), out)
        return
    scales = scales.to(device=out.device)
    positive = _storage(scales.to(out.dtype))
    negative = _storage((-scales).to(out.dtype))
    _run("select_decode", out, _array(bits), positive, negative, _storage(out), out.numel())


def _decode_host(bits: np.ndarray, positive: np.ndarray, out: torch.Tensor) -> None:
    """``decode`` into a float32 CPU ``out`` from numpy views of the sign rows and their scales."""
    _run("select_decode", out, bits, positive, -positive, out.numpy().reshape(-1), out.numel())


_RAW = {torch.float32: (torch.int32, np.uint32, 1 << 31), torch.float16: (torch.int16, np.uint16, 1 << 15),
        torch.bfloat16: (torch.int16, np.uint16, 1 << 15)}
"""Per output dtype: the torch and numpy integer types of its raw bits, and its sign bit."""


def decode_framed(rows: torch.Tensor, out: torch.Tensor) -> None:
    """out (contiguous) <- the decode of (n, SCALE_BYTES + nbytes) wire rows: ``unframe``, then ``decode``.

    On CUDA one kernel reads the scales from the rows' heads and rounds them to ``out``'s
    dtype itself (``kernels.cuda.decode_framed``); on the CPU a 16-bit ``out`` has them rounded
    by torch first.
    """
    if not on_host(rows):
        _run("decode_framed", rows, _array(rows), DeviceArray.flat(out, _RAW[out.dtype][1]), out.numel(),
             str(out.dtype).removeprefix("torch."))
    elif out.dtype == torch.float32:
        table = rows.numpy()
        _decode_host(table[:, SCALE_BYTES:], _heads(table), out)
    else:
        scales, signs = unframe(rows)
        decode(signs, scales, out.view(-1))


def _result(out: torch.Tensor | None, shape: tuple[int, ...], dtype: torch.dtype, device: torch.device
            ) -> torch.Tensor:
    """A codec's result: the caller's ``out`` (that many elements, 1-D) seen as ``shape``, or a new tensor."""
    if out is None:
        return torch.empty(shape, dtype=dtype, device=device)
    return out if len(shape) == 1 else out.view(shape)


def row_absmax(source: torch.Tensor, rows: int, length: int, out: torch.Tensor | None = None) -> torch.Tensor:
    """Per-row max |x| of ``source`` zero-padded to ``length`` and cut into ``rows`` rows (float32), into ``out``
    (``rows`` float32 elements on ``source``'s device) where given.

    A row holding NaN gets NaN, one holding Inf gets Inf.
    """
    src, lut = _source(source)
    out = _result(out, (rows,), torch.float32, source.device)
    _run("row_absmax", source, src, lut, source.numel(), length // rows, _array(out))
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
    src, lut = _source(source)
    scales = scales.to(device=source.device, dtype=torch.float32)
    if on_host(source):
        stream = np.uint64(key if isinstance(key, int) else int(key.numpy().view(np.uint64)[0]))
    else:
        if isinstance(key, int):
            key = stream_keys([key], torch.empty(1, dtype=torch.int64, device=source.device))
        stream = DeviceArray(key.data_ptr(), (1,), (8,), np.dtype(np.uint64), key)
    _run("randomized_encode", source, src, lut, source.numel(), _array(scales), stream, start, _array(rows))


def stream_keys(keys: list[int], out: torch.Tensor, staging: torch.Tensor | None = None) -> torch.Tensor:
    """out[j] <- the 64 bits of ``keys[j]`` (``spec.stream_key``s, below 2^64) as int64, for ``randomized_encode``;
    returns ``out``.

    1. Written into ``staging`` (host int64, as long as ``out``; a new one where None), or into ``out`` itself on
       the host.
    2. On a device, copied into ``out`` with no host wait (``to_device``).
    """
    host = out if out.is_cpu else (torch.empty(out.numel(), dtype=torch.int64) if staging is None else staging)
    host.numpy().view(np.uint64)[:] = keys
    return out if host is out else to_device(host, out)


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
    scales = _result(out, (rows.shape[0],), torch.float32, rows.device)
    _run("head_weights", rows, _array(rows), divisor, _array(scales))
    return scales, rows[:, SCALE_BYTES:]


def _heads(table: np.ndarray) -> np.ndarray:
    """The float32 scales at the heads of host wire rows (a copy)."""
    return table[:, :SCALE_BYTES].copy().view(np.float32).reshape(-1)


def block_sums(tensor: torch.Tensor | None, error: torch.Tensor, block_size: int, scale: str = "l2",
               rows: int = 1, out: torch.Tensor | None = None) -> torch.Tensor:
    """Float64 sums of |x|^p over the blocks of x = ``error + pad(tensor)`` (p: ``scale``'s power), on ``error``'s
    device: x cut into ``rows`` equal rows, each into blocks of ``block_size`` from its start, the last one
    shorter where needed (``spec.block_lengths``); row-major; into ``out`` (float64, one element a block) where
    given. ``tensor=None`` sums ``error`` alone. Writes nothing else."""
    src, lut = (_no_source(error), None) if tensor is None else _source(tensor)
    row_len = error.numel() // rows
    blocks = rows * -(-row_len // block_size)
    sums = _result(out, (blocks,), torch.float64, error.device)
    _run("block_power_sums", error, src, lut, _array(error), 0 if tensor is None else tensor.numel(), block_size,
         row_len, spec.SCALES[scale], _array(sums))
    return sums


def encode_blocks(tensor: torch.Tensor | None, error: torch.Tensor, scales: torch.Tensor, block_size: int,
                  bits: torch.Tensor) -> None:
    """``compensate_encode`` with scale ``scales[i // block_size]`` for element i; ``bits`` is (rows, row_bytes),
    possibly the sign bytes of framed wire rows (``frame_scales``)."""
    src, lut = (_no_source(error), None) if tensor is None else _source(tensor)
    _run("encode_blocks", error, src, lut, _array(error), 0 if tensor is None else tensor.numel(), _array(scales),
         block_size, _array(bits))


def accumulate_blocks(bits: torch.Tensor, weights: torch.Tensor, block_size: int, base: torch.Tensor | None,
                      out: torch.Tensor, count: int) -> None:
    """out[:count] <- sum_r weights[r, i // block_size] * signs(bits[r]) (+ base), rank by rank in float32."""
    out_view = _array(out)
    _run("accumulate_blocks", out, _array(bits), _array(weights), block_size, _base(base, out, out_view), out_view,
         count)


def _raw_host(tensor: torch.Tensor) -> np.ndarray:
    """The raw bits of a contiguous CPU float tensor as a flat unsigned numpy view (no copy; numpy has no bfloat16)."""
    torch_int, numpy_uint, _ = _RAW[tensor.dtype]
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
    _, raw, sign = _RAW[out.dtype]
    if not on_host(rows):
        _run("decode_framed_blocks", out, _array(rows), _steps(rows), per_row, block_size,
             DeviceArray.flat(out, raw), out.numel(), str(out.dtype).removeprefix("torch."))
        return
    scales, bits = unframe_blocks(rows, per_row)
    rounded = _raw_host(scales.to(out.dtype)).reshape(scales.shape)
    _run("decode_blocks", out, bits.numpy(), rounded, block_size, raw(sign), _raw_host(out), out.numel())


@lru_cache(maxsize=None)
def _scale_steps(device: torch.device) -> torch.Tensor:
    """``spec.SCALE_STEPS`` on ``device`` (copied, so every device holds the host's bits)."""
    return torch.from_numpy(spec.SCALE_STEPS).to(device)


def _steps(like: torch.Tensor):
    """The kernel view of ``spec.SCALE_STEPS`` for ``like``'s kernels: the host's array, or its copy on the device."""
    return spec.SCALE_STEPS if on_host(like) else _array(_scale_steps(like.device))


def frame_scales(rows: torch.Tensor, values: torch.Tensor, scale: str | None = None, block_size: int = 1,
                 row_len: int = 1, out: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Code the block scales of (n, SCALE_BYTES + m + nbytes) wire rows against each row's largest, in front of
    the rows' bytes: ``spec.code_scales``' bits, in one kernel on every device (``kernels.cpu.code_blocks``).

    ``values`` holds the n * m scales (float32; ``scale`` None), or the float64 sums of |x|^p of
    blocks of ``block_size`` elements of rows of ``row_len`` (``block_sums``), whose ``scale``
    ("l2", "l1": ``spec.block_scales_from``) is coded.
    1. Row r's largest scale, ref_r, as 4 bytes at its head; then the m codes of its scales.
    2. The decoded scales v[code] (what every rank uses, the encoder included), into ``out``
       (n * m float32 elements) where given.

    Returns:
        (the decoded scales, (n, m) float32; the rows' bytes behind the codes, a view).
    """
    n = rows.shape[0]
    m = values.numel() // n
    decoded = _result(out, (n, m), torch.float32, rows.device)
    power = 0 if scale is None else spec.SCALES[scale]
    _run("code_blocks", decoded, _array(values.reshape(-1)), block_size, row_len, power, _steps(rows), _array(rows),
         _array(decoded))
    return decoded, rows[:, SCALE_BYTES + m:]


def unframe_blocks(rows: torch.Tensor, per_row: int, divisor: int = 1, out: torch.Tensor | None = None
                   ) -> tuple[torch.Tensor, torch.Tensor]:
    """Split (n, SCALE_BYTES + per_row + nbytes) wire rows into the (n, per_row) decoded float32 block scales (into
    ``out``, n * per_row float32 elements, where given) and the sign bytes (a view):
    float32(float64(ref_r) * SCALE_STEPS[code]) / ``divisor`` (IEEE float32 division, as ``divide_``: the weights
    s / n), in one kernel (``decode_codes``)."""
    n = rows.shape[0]
    decoded = _result(out, (n, per_row), torch.float32, rows.device)
    _run("decode_codes", decoded, _array(rows), _steps(rows), divisor, _array(decoded))
    return decoded, rows[:, SCALE_BYTES + per_row:]


def block_absmax(tensor: torch.Tensor, error: torch.Tensor, block_size: int, rows: int,
                 out: torch.Tensor | None = None) -> torch.Tensor:
    """Float32 max |x| over the blocks of x = ``error + pad(tensor)`` cut into ``rows`` equal rows (``block_sums``'
    blocks), on ``error``'s device, into ``out`` where given; NaN where a block holds NaN. Writes nothing else."""
    src, lut = _source(tensor)
    row_len = error.numel() // rows
    blocks = rows * -(-row_len // block_size)
    out = _result(out, (blocks,), torch.float32, error.device)
    _run("block_absmax", error, src, lut, _array(error), tensor.numel(), block_size, row_len, _array(out))
    return out


def level_steps(absmax: torch.Tensor, bits: int, out: torch.Tensor) -> torch.Tensor:
    """``out`` <- ``spec.level_step`` of ``absmax`` in torch on its device: one float32 multiply, correctly rounded
    everywhere, by the factor as a Python number (a float32 value, which torch multiplies a float32 tensor by in
    float32), so no tensor of it is made or copied to the device; into ``out``, so nothing is allocated."""
    return torch.mul(absmax, float(spec.level_step(np.float32(1.0), bits)), out=out)


def encode_levels(tensor: torch.Tensor, error: torch.Tensor, steps: torch.Tensor, block_size: int, bits: int,
                  planes: torch.Tensor) -> None:
    """planes <- the ``bits``-bit levels of x = error + pad(tensor) with step ``steps[i // block_size]`` for element i
    (``reference.compress_levels``); error <- x - their values. ``planes`` is (rows, bits * row_bytes), possibly the
    level bytes of framed wire rows (``frame_scales``)."""
    src, lut = _source(tensor)
    _run("encode_levels", error, src, lut, _array(error), tensor.numel(), _array(steps), block_size, bits,
         _array(planes))


def accumulate_levels(planes: torch.Tensor, weights: torch.Tensor, block_size: int, bits: int, out: torch.Tensor,
                      count: int) -> None:
    """out[:count] <- sum_r float32(level_r * weights[r, i // block_size]) rank by rank in float32, level_r the
    centred level of rank r's row (``reference.compressed_reduce_scatter``)."""
    _run("accumulate_levels", out, _array(planes), _array(weights), block_size, bits, _array(out), count)


def decode_levels(planes: torch.Tensor, steps: torch.Tensor, block_size: int, bits: int, out: torch.Tensor,
                  count: int) -> None:
    """out[:count] <- every row's levels, row r into out[r * row_len:] (row_len = 8 * its bytes a plane), each
    float32(level_r * steps[r, k // block_size]) as ``accumulate_levels`` gives for one row: the decode of n served
    rows in one kernel (``reference`` ``_levels_allreduce``, step 3)."""
    _run("decode_levels", out, _array(planes), _array(steps), block_size, bits, _array(out), count)
