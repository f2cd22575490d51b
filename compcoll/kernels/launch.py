"""The one path of every CUDA kernel launch and host read of compcoll's kernels: counted, and pre-bound.

``launch`` runs a ``numba.cuda.jit`` kernel in one of two ways:

* **bound** (the default): the kernel is compiled once per argument-type variant and GPU,
  then launched through ``cuda.core.launch`` with its arguments flattened from raw
  pointers, so no call types its arguments or wraps a tensor;
* **numba**: numba's own dispatcher (``kernel[grid, block, stream](*args)``), each tensor
  wrapped with ``cuda.as_cuda_array``. ``COMPCOLL_CUDA_LAUNCHER=numba`` selects it, and the
  CUDA simulator always uses it.

Meta tensors trace the CUDA path on a machine without a GPU: their kernels get the
``TRACED`` stream, on which ``launch`` counts (and, as numba's dispatcher would, wraps)
without launching, and ``read_first`` counts a wait and answers a stand-in ``1.0``. So the
counts of a call on meta tensors are those of the same call on CUDA tensors
(``scripts/cuda_launches.py``).

Under numba's CUDA simulator (``NUMBA_ENABLE_CUDASIM=1``), ``simulate(True)`` (or
``COMPCOLL_CUDA_ON_CPU=1``) makes CPU tensors take the CUDA path too, down to these
launches: their kernels run in the simulator on the tensors' own memory, read through
the same ``DeviceArray`` pointers, shapes and strides a GPU gets. So the whole CUDA path
of every call is checked, bit for bit, on a machine without a GPU (slowly).

The bound path depends on numba-cuda's own layout of a kernel's parameters and on three
private names (``_Kernel._codelibrary``, its ``get_cufunc().kernel``, and
``driver._to_core_stream``), pinned in ``PINNED_NUMBA_CUDA`` and checked by
``scripts/cuda_ptx.py``.
"""

from __future__ import annotations

import ctypes
import math
import os
import threading
from contextlib import nullcontext
from dataclasses import dataclass
from functools import lru_cache

import numpy as np
from numba import config

from ..recording import NO_CONTEXT, Recording, current

LAUNCHER_ENV = "COMPCOLL_CUDA_LAUNCHER"
SIMULATE_ENV = "COMPCOLL_CUDA_ON_CPU"
SIMULATED_DEVICE = 0
"""The GPU a CPU tensor's kernels run on while simulating: the simulator's one."""
LAUNCHERS = ("bound", "numba")
PINNED_NUMBA_CUDA = "0.30.4"
"""The numba-cuda whose parameter layout and private attributes the bound launcher uses."""


@dataclass
class Counts:
    """What the kernels asked of the GPU and the host since the last ``reset``."""

    launches: int = 0
    """Kernel launches (through either launcher) and device-to-device copies."""
    wraps: int = 0
    """Tensors wrapped for numba's dispatcher (``cuda.as_cuda_array``, about 27 us each on an H100)."""
    waits: int = 0
    """Host waits for the device (a value read back to the host)."""

    def reset(self) -> None:
        self.launches = self.wraps = self.waits = 0


COUNTS = Counts()
"""The process's counts (every thread's launches together)."""
_LOCK = threading.Lock()


def simulating() -> bool:
    """Whether CPU tensors take the CUDA path, their kernels under numba's simulator (``simulate``)."""
    return _SIMULATING[0]


def simulate(on: bool) -> None:
    """Make CPU tensors take the CUDA path (``on``), or their own again; ValueError without numba's simulator."""
    if on and not config.ENABLE_CUDASIM:
        raise ValueError(f"compcoll: CPU tensors take the CUDA path ({SIMULATE_ENV}=1, simulate(True)) only under "
                         "numba's CUDA simulator: set NUMBA_ENABLE_CUDASIM=1 before numba is imported")
    _SIMULATING[0] = bool(on)


_SIMULATING = [False]
"""The one flag ``simulating`` reads (``simulate`` sets it; ``COMPCOLL_CUDA_ON_CPU=1`` at import)."""
_SIMULATOR = threading.RLock()
"""One kernel call at a time under numba's simulator (``context_for``): a simulated launch swaps the ``cuda`` of its
kernel's module for a fake (and of a device function's module, for each call of it), which a kernel built meanwhile
in another thread would meet."""


simulate(os.environ.get(SIMULATE_ENV) == "1")


class _Traced:
    """The stream of meta tensors' kernels: counted, never launched."""

    def __repr__(self) -> str:
        return "TRACED"


TRACED = _Traced()
"""The stream ``codecs`` gives the kernels of meta tensors."""
TRACED_DEVICE = -1
"""The GPU ``device_of(TRACED)`` names: none."""


def launcher() -> str:
    """The launcher in use: ``COMPCOLL_CUDA_LAUNCHER`` (``bound`` unless set), ``numba`` under the simulator."""
    chosen = os.environ.get(LAUNCHER_ENV, "bound")
    if chosen not in LAUNCHERS:
        raise ValueError(f"compcoll: {LAUNCHER_ENV}={chosen!r}; use one of {LAUNCHERS}")
    return "numba" if config.ENABLE_CUDASIM else chosen


class DeviceArray:
    """A view of device memory as a kernel argument: pointer, shape, byte strides and numpy dtype.

    It holds ``owner`` (the tensor whose memory it is) alive, and offers what numba's
    dispatcher needs to wrap it (``__cuda_array_interface__``); the bound launcher reads
    its fields directly.
    """

    __slots__ = ("ptr", "shape", "strides", "dtype", "owner")

    def __init__(self, ptr: int, shape: tuple[int, ...], strides: tuple[int, ...], dtype: np.dtype, owner) -> None:
        self.ptr, self.shape, self.strides, self.dtype, self.owner = ptr, shape, strides, dtype, owner

    @classmethod
    def of(cls, tensor) -> DeviceArray:
        """A view of a CUDA torch tensor, in place."""
        itemsize, strides = tensor.element_size(), tensor.stride()
        strides = (strides[0] * itemsize,) if len(strides) == 1 else tuple(s * itemsize for s in strides)
        return cls(tensor.data_ptr(), tuple(tensor.shape), strides, _numpy_dtype(tensor.dtype), tensor)

    @classmethod
    def flat(cls, tensor, dtype=None) -> DeviceArray:
        """A 1-D view of a contiguous CUDA torch tensor, in place, as ``dtype`` (a numpy dtype of the same item size;
        default the tensor's): what ``tensor.view(-1)`` then ``of`` would give, with no torch view made."""
        itemsize = tensor.element_size()
        return cls(tensor.data_ptr(), (tensor.numel(),), (itemsize,),
                   _numpy_dtype(tensor.dtype) if dtype is None else np.dtype(dtype), tensor)

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def contiguous(self) -> bool:
        """Whether the strides are C order's (numba's layout "C"; otherwise "A")."""
        step = self.dtype.itemsize
        for extent, stride in zip(reversed(self.shape), reversed(self.strides)):
            if extent != 1 and stride != step:
                return False
            step *= extent
        return True

    def view(self, dtype) -> DeviceArray:
        """The same memory as another dtype of the same size."""
        dtype = np.dtype(dtype)
        if dtype.itemsize != self.dtype.itemsize:
            raise ValueError(f"DeviceArray.view: {self.dtype} and {dtype} differ in size")
        return DeviceArray(self.ptr, self.shape, self.strides, dtype, self.owner)

    def __getitem__(self, key: slice) -> DeviceArray:
        """A 1-D slice with step 1 (``values[:1]``)."""
        start, stop, step = key.indices(self.shape[0])
        if self.ndim != 1 or step != 1:
            raise ValueError("DeviceArray: only 1-D slices with step 1")
        return DeviceArray(self.ptr + start * self.strides[0], (max(0, stop - start),), self.strides, self.dtype,
                           self.owner.reshape(-1)[start:stop])

    @property
    def __cuda_array_interface__(self) -> dict:
        return {"shape": self.shape, "strides": None if self.contiguous else self.strides,
                "data": (self.ptr, False), "typestr": self.dtype.str, "version": 2}


def _numpy_dtype(torch_dtype) -> np.dtype:
    """The numpy dtype of a torch dtype the kernels take (the table filled at the first lookup: torch is imported
    late)."""
    found = _NUMPY_DTYPES.get(torch_dtype)
    if found is None:
        import torch

        _NUMPY_DTYPES.update({torch.float32: np.dtype(np.float32), torch.float64: np.dtype(np.float64),
                              torch.uint8: np.dtype(np.uint8), torch.bool: np.dtype(np.bool_),
                              torch.int16: np.dtype(np.int16), torch.int32: np.dtype(np.int32),
                              torch.int64: np.dtype(np.int64)})
        found = _NUMPY_DTYPES[torch_dtype]
    return found


_NUMPY_DTYPES: dict = {}
"""The numpy dtype of each torch dtype the kernels take (``_numpy_dtype``)."""


def launch(kernel, grid: int, block: int, stream, *args) -> None:
    """Launch ``kernel`` (a ``numba.cuda.jit`` dispatcher) on ``grid`` x ``block`` threads in ``stream``.

    1. Count the launch.
    2. Bound: find the variant compiled for the arguments' types on the current GPU
       (compiled on first use), flatten the arguments as numba lays out its parameters,
       and launch through ``cuda.core``.
    3. numba: wrap each ``DeviceArray`` (counted) and call numba's dispatcher.
    4. ``TRACED``: count the wraps numba's dispatcher would make, and launch nothing.
    """
    with _LOCK:
        COUNTS.launches += 1
    recording = current()
    if stream is TRACED:
        if launcher() == "numba":
            with _LOCK:
                COUNTS.wraps += sum(map(_wrapped, args))
        if recording is not None:
            recording.launch((launch, (kernel, grid, block, stream, *_unkept(recording, args)), NO_CONTEXT),
                             _signature(kernel, grid, block, args), [])
        return
    if launcher() == "bound":
        device = device_of(stream)
        core_kernel, flatteners = _bound(kernel, device, tuple(map(_key, args)))
        flat = []
        for flatten, arg in zip(flatteners, args):
            flatten(arg, flat)
        core_stream, config = _core_stream(stream), _config(grid, block)
        _core_launch(core_stream, config, core_kernel, *flat)
        if recording is not None:
            recording.launch((_replay_launch, (core_stream, config, core_kernel, *flat), device),
                             _signature(kernel, grid, block, args), _owners(recording, args))
        return
    kernel[grid, block, stream](*(_wrap(a) for a in args))
    if recording is not None:
        recording.launch((launch, (kernel, grid, block, stream, *_unkept(recording, args)), device_of(stream)),
                         _signature(kernel, grid, block, args), [])


def _signature(kernel, grid: int, block: int, args: tuple) -> tuple:
    """What a launch did, comparable between two recordings: the kernel, its grid, and each argument's value (a
    view's address, shape, byte strides and dtype; a scalar's type and value)."""
    return (kernel, grid, block, *((a.ptr, a.shape, a.strides, a.dtype) if isinstance(a, DeviceArray) else
                                   (type(a), a) for a in args))


def _replay_launch(stream, config, kernel, *flat) -> None:
    """A bound launch replayed from its recording (``recording``): counted, its arguments flattened already."""
    with _LOCK:
        COUNTS.launches += 1
    _core_launch(stream, config, kernel, *flat)


def _owners(recording: Recording, args: tuple) -> list:
    """The tensors a recorded launch's ``args`` point into that the recording keeps alive: all but the call's own
    (``Recording.keyed_index``), which each replayed call brings."""
    return [arg.owner for arg in args if isinstance(arg, DeviceArray) and arg.owner is not None
            and recording.keyed_index(arg.ptr) is None]


def _unkept(recording: Recording, args: tuple) -> tuple:
    """``args`` for a launch replayed through ``launch`` itself: each view of the call's own tensors without its
    tensor (``_KEYED`` in its place, so that it still counts as wrapped), every other view as it is (kept alive)."""
    return tuple(DeviceArray(a.ptr, a.shape, a.strides, a.dtype, _KEYED)
                 if isinstance(a, DeviceArray) and a.owner is not None and recording.keyed_index(a.ptr) is not None
                 else a
                 for a in args)


_KEYED = object()
"""The owner of a recorded view of a call's own tensor (``_unkept``)."""


def _wrapped(arg) -> bool:
    """Whether numba's dispatcher gets ``arg`` wrapped: a view of a tensor (``device_zeros``' are numba's own)."""
    return isinstance(arg, DeviceArray) and arg.owner is not None


def _wrap(arg):
    if not _wrapped(arg):
        return arg
    from numba import cuda

    with _LOCK:
        COUNTS.wraps += 1
    if config.ENABLE_CUDASIM:
        return _simulated(arg)
    return cuda.as_cuda_array(arg, sync=False)


def _simulated(arg: DeviceArray):
    """The simulator's array over a ``DeviceArray``'s host memory: its pointer, shape and byte strides, no copy."""
    from numba.cuda.simulator.cudadrv.devicearray import FakeCUDAArray

    if arg.size == 0:
        return FakeCUDAArray(np.empty(arg.shape, arg.dtype))
    extent = arg.dtype.itemsize + sum((n - 1) * s for n, s in zip(arg.shape, arg.strides))
    memory = (ctypes.c_char * extent).from_address(arg.ptr)
    return FakeCUDAArray(np.ndarray(arg.shape, arg.dtype, buffer=memory, strides=arg.strides))


def read_first(values, stream) -> float:
    """values[0] on the host: waits for the stream (counted); on the ``TRACED`` stream, the stand-in 1.0."""
    found = _read(values, stream, 1)
    return 1.0 if found is None else found[0]


def read_values(values, stream) -> list[float] | None:
    """Every element of the 1-D ``values`` on the host, in one copy: waits for the stream (counted); on the
    ``TRACED`` stream, None (nothing ran)."""
    return _read(values, stream, None)


def _read(values, stream, count: int | None) -> list[float] | None:
    """values[:count] (None: all) on the host, counted as a wait; None on the ``TRACED`` stream."""
    with _LOCK:
        COUNTS.waits += 1
    recording = current()
    if recording is not None:
        recording.refuse("a value read to the host")
    if stream is TRACED:
        return None
    if isinstance(values, DeviceArray):
        return values.owner.view(-1)[:count].tolist()
    host = values[:count].copy_to_host(stream=stream)
    if stream:
        stream.synchronize()
    return host.tolist()


_STREAM_DEVICES: dict = {TRACED: TRACED_DEVICE}
"""The GPU of each stream made by ``stream_on`` (numba's streams do not record it), and of ``TRACED``."""


def stream_on(device: int, handle: int):
    """numba's view of the CUDA stream ``handle`` of GPU ``device``, its GPU recorded for ``device_of``."""
    from numba import cuda

    with cuda.gpus[device]:
        stream = cuda.external_stream(handle)
    _STREAM_DEVICES[stream] = device
    return stream


def device_of(stream) -> int:
    """The GPU of a stream made by ``stream_on``; otherwise (the default stream, the simulator's) the current one."""
    found = _STREAM_DEVICES.get(stream) if stream else None
    return _device_id() if found is None else found


def device_zeros(device: int, size: int, dtype) -> object:
    """``size`` zeros of ``dtype`` on GPU ``device`` (numba's allocation); on ``TRACED_DEVICE``, a view of no
    memory."""
    if device == TRACED_DEVICE:
        dtype = np.dtype(dtype)
        return DeviceArray(0, (size,), (dtype.itemsize,), dtype, None)
    from numba import cuda

    with cuda.gpus[device]:
        return cuda.to_device(np.zeros(size, dtype))


def context_for(device: int):
    """A context manager that makes GPU ``device`` current for the kernels: none where a context of that GPU
    already is (the driver's current context, asked directly: numba's lookup costs about 10 us), else numba's;
    under numba's simulator, a lock held for the kernel call (its one GPU needs no context)."""
    from numba import cuda

    if config.ENABLE_CUDASIM:
        return _SIMULATOR
    if launcher() == "bound":
        from cuda.bindings import driver

        error, current = driver.cuCtxGetDevice()
        if error == driver.CUresult.CUDA_SUCCESS and int(current) == device:
            return _NOTHING
    return cuda.gpus[device]


_NOTHING = nullcontext()


def _device_id() -> int:
    from numba import cuda

    return cuda.gpus.current.id


def _key(arg) -> tuple:
    """What selects a compiled variant: an array's dtype, rank and layout, or a scalar's type.

    It runs for every argument of every launch, so the common cases take a short way: a 1-D
    contiguous ``DeviceArray`` (most arguments) and the scalar types the kernels take get keys
    made once (``_FLAT_KEYS``, ``_SCALAR_KEYS``).
    """
    if type(arg) is DeviceArray:
        shape = arg.shape
        if len(shape) == 1 and (arg.strides[0] == arg.dtype.itemsize or shape[0] == 1):
            found = _FLAT_KEYS.get(arg.dtype)
            if found is None:
                found = _FLAT_KEYS[arg.dtype] = ("array", arg.dtype, 1, True)
            return found
        return ("array", arg.dtype, len(shape), arg.contiguous)
    found = _SCALAR_KEYS.get(type(arg))
    if found is not None:
        return found
    if hasattr(arg, "__cuda_memory__"):
        return ("array", arg.dtype, arg.ndim, arg.is_c_contiguous())
    return ("scalar", type(arg))


_FLAT_KEYS: dict = {}
"""The key of a 1-D contiguous array, by dtype (``_key``)."""
_SCALAR_KEYS = {kind: ("scalar", kind) for kind in (bool, int, float, np.float32, np.float64, np.int64, np.uint64)}


def numba_type(key: tuple):
    """The numba type of an argument ``_key`` describes (what numba's dispatcher would type it as)."""
    from numba.cuda import types
    from numba.cuda.np.numpy_support import from_dtype

    if key[0] == "array":
        return types.Array(from_dtype(key[1]), key[2], "C" if key[3] else "A")
    return {bool: types.boolean, int: types.int64, float: types.float64, np.float32: types.float32,
            np.float64: types.float64, np.int64: types.int64, np.uint64: types.uint64}[key[1]]


def flattener(numba_arg_type):
    """A function appending an argument's kernel parameters to a list, as numba-cuda lays them out.

    Arrays: meminfo and parent (0), the element count, the item size, the data pointer,
    then the shape and the byte strides. Scalars: one value of the parameter's own width.
    """
    from numba.cuda import types

    if isinstance(numba_arg_type, types.Array):
        def array(arg, flat: list) -> None:
            ptr = arg.ptr if isinstance(arg, DeviceArray) else arg.device_ctypes_pointer.value or 0
            flat.extend((0, 0, math.prod(arg.shape), arg.dtype.itemsize, ptr))
            flat.extend(arg.shape)
            flat.extend(arg.strides)

        return array
    width = {types.boolean: np.bool_, types.int64: np.int64, types.uint64: np.uint64, types.float32: np.float32,
             types.float64: np.float64}[numba_arg_type]

    def scalar(arg, flat: list) -> None:
        flat.append(width(arg))

    return scalar


def parameter_widths(flat: list) -> list[int]:
    """The bytes ``cuda.core.launch`` passes for each flattened value (checked against PTX): a Python int as a
    pointer-sized integer, a numpy scalar at its own width."""
    return [8 if isinstance(value, int) else value.itemsize for value in flat]


@lru_cache(maxsize=None)
def _bound(kernel, device: int, keys: tuple):
    """The cuda.core kernel of ``kernel``'s variant for ``keys`` on GPU ``device``, and its flatteners."""
    from numba import cuda

    argtypes = tuple(numba_type(k) for k in keys)
    with cuda.gpus[device]:
        compiled = kernel.compile(argtypes)
        return compiled._codelibrary.get_cufunc().kernel, tuple(flattener(t) for t in argtypes)


@lru_cache(maxsize=None)
def _config(grid: int, block: int):
    from cuda.core import LaunchConfig

    return LaunchConfig(grid=grid, block=block)


@lru_cache(maxsize=None)
def _core_stream(stream):
    """cuda.core's view of a numba stream (or 0: the default stream), made once per stream."""
    from numba.cuda.cudadrv import driver

    return driver._to_core_stream(stream)


def _core_launch(stream, config, kernel, *args) -> None:
    _core_launcher()(stream, config, kernel, *args)


@lru_cache(maxsize=None)
def _core_launcher():
    """``cuda.core.launch``, imported once (an import statement per launch costs a microsecond)."""
    from cuda.core import launch as core_launch

    return core_launch
