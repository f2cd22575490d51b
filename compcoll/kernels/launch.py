"""The one path of every CUDA kernel launch and host read of compcoll's kernels, counted.

``launch`` runs a ``numba.cuda.jit`` kernel in one of two ways:

* **bound** (the default): the kernel is compiled once per argument-type variant and GPU,
  then launched through ``cuda.core.launch`` with its arguments flattened from raw
  pointers, so no call types its arguments or wraps a tensor;
* **numba**: numba's own dispatcher (``kernel[grid, block, stream](*args)``), each tensor
  wrapped with ``cuda.as_cuda_array``. ``COMPCOLL_CUDA_LAUNCHER=numba`` at import (or
  ``use_launcher("numba")``) selects it, and the CUDA simulator always uses it.

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

The bound path is ``kernels.bound``'s; the arguments are ``kernels.arrays.DeviceArray`` views.
"""

from __future__ import annotations

import ctypes
import os
import threading
import time
from contextlib import nullcontext
from dataclasses import dataclass

import numpy as np
from numba import config

from ..recording import NO_CONTEXT, Recording, current
from .arrays import DeviceArray
from .bound import bound_kernel, core_launch, core_stream, launch_config, variant_key

LAUNCHER_ENV = "COMPCOLL_CUDA_LAUNCHER"
SIMULATE_ENV = "COMPCOLL_CUDA_ON_CPU"
SIMULATED_DEVICE = 0
"""The GPU a CPU tensor's kernels run on while simulating: the simulator's one."""
LAUNCHERS = ("bound", "numba")
MAX_GRID = 2 ** 31 - 1
"""Blocks a 1-D launch may have."""
MAX_BLOCK = 1024
"""Threads a block may have."""


@dataclass
class Counts:
    """What the kernels asked of the GPU and the host since the last ``reset``."""

    launches: int = 0
    """Kernel launches (through either launcher) and device-to-device copies."""
    wraps: int = 0
    """Tensors wrapped for numba's dispatcher (``cuda.as_cuda_array``, about 27 us each on an H100)."""
    waits: int = 0
    """Host waits for the device (a value read back to the host)."""
    waited: float = 0.0
    """Seconds the host spent in those waits (each read's copy and wait, timed by ``time.perf_counter``): what of a
    call's host time is the device's work it waited for, not the host's own (``bench.clocks.own_host_seconds``)."""

    def reset(self) -> None:
        self.launches = self.wraps = self.waits = 0
        self.waited = 0.0


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


_CHOSEN = [os.environ.get(LAUNCHER_ENV, "bound")]
"""The launcher asked for: ``COMPCOLL_CUDA_LAUNCHER`` at import (``bound`` unless set), then ``use_launcher``'s. Read
from here, not from the environment, at every launch and replay (an environment lookup cost about 0.5 us, 7 a call)."""


def launcher() -> str:
    """The launcher in use: the one asked for (``use_launcher``; ``COMPCOLL_CUDA_LAUNCHER`` at import, ``bound``
    unless set), ``numba`` under the simulator. ValueError naming the variable where it asked for none of
    ``LAUNCHERS``."""
    chosen = _CHOSEN[0]
    if chosen not in LAUNCHERS:
        raise ValueError(f"compcoll: {LAUNCHER_ENV}={chosen!r}; use one of {LAUNCHERS}")
    return "numba" if config.ENABLE_CUDASIM else chosen


def use_launcher(name: str) -> str:
    """Launch through ``name`` (one of ``LAUNCHERS``) from now on, in every thread; returns the launcher asked for
    before (to put back). ``COMPCOLL_CUDA_LAUNCHER`` chooses at import; a change of the variable later is not read."""
    if name not in LAUNCHERS:
        raise ValueError(f"compcoll: no launcher {name!r}; use one of {LAUNCHERS}")
    previous, _CHOSEN[0] = _CHOSEN[0], name
    return previous


def launch(kernel, grid: int, block: int, stream, *args) -> None:
    """Launch ``kernel`` (a ``numba.cuda.jit`` dispatcher) on ``grid`` x ``block`` threads in ``stream``.

    1. Count the launch.
    2. Bound: find the variant compiled for the arguments' types on the current GPU
       (compiled on first use), flatten the arguments as numba lays out its parameters,
       and launch through ``cuda.core``.
    3. numba: wrap each ``DeviceArray`` (counted) and call numba's dispatcher.
    4. ``TRACED``: count the wraps numba's dispatcher would make, and launch nothing.
    The numba and traced launches (the simulator's, the counts on meta tensors) check the launch's shape first
    (``_check_shape``), which the driver would refuse on a GPU; the bound launches leave that to the driver.
    """
    with _LOCK:
        COUNTS.launches += 1
    recording = current()
    if stream is TRACED:
        _check_shape(kernel, grid, block)
        if launcher() == "numba":
            with _LOCK:
                COUNTS.wraps += sum(map(_wrapped, args))
        if recording is not None:
            recording.launch((launch, (kernel, grid, block, stream, *_unkept(recording, args)), NO_CONTEXT),
                             _signature(kernel, grid, block, args), [])
        return
    if launcher() == "bound":
        device = device_of(stream)
        core_kernel, flatteners = bound_kernel(kernel, device, tuple(map(variant_key, args)))
        flat = []
        for flatten, arg in zip(flatteners, args):
            flatten(arg, flat)
        on, shape = core_stream(stream), launch_config(grid, block)
        core_launch(on, shape, core_kernel, *flat)
        if recording is not None:
            recording.launch((_replay_launch, (on, shape, core_kernel, *flat), device),
                             _signature(kernel, grid, block, args), _owners(recording, args))
        return
    _check_shape(kernel, grid, block)
    kernel[grid, block, stream](*(_wrap(a) for a in args))
    if recording is not None:
        recording.launch((launch, (kernel, grid, block, stream, *_unkept(recording, args)), device_of(stream)),
                         _signature(kernel, grid, block, args), [])


def _check_shape(kernel, grid: int, block: int) -> None:
    """ValueError where a GPU's driver would refuse ``grid`` blocks of ``block`` threads: no block, or no thread, or
    more than ``MAX_GRID`` blocks or ``MAX_BLOCK`` threads (numba's simulator would run them, or none)."""
    if not (1 <= grid <= MAX_GRID and 1 <= block <= MAX_BLOCK):
        name = getattr(getattr(kernel, "py_func", kernel), "__qualname__", kernel)
        raise ValueError(f"compcoll: kernel {name} launched on {grid} blocks of {block} threads: a GPU takes 1 to "
                         f"{MAX_GRID} blocks of 1 to {MAX_BLOCK} threads")


def _signature(kernel, grid: int, block: int, args: tuple) -> tuple:
    """What a launch did, comparable between two recordings: the kernel, its grid, and each argument's value (a
    view's address, shape, byte strides and dtype; a scalar's type and value)."""
    return (kernel, grid, block, *((a.ptr, a.shape, a.strides, a.dtype) if isinstance(a, DeviceArray) else
                                   (type(a), a) for a in args))


def _replay_launch(stream, config, kernel, *flat) -> None:
    """A bound launch replayed from its recording (``recording``): counted, its arguments flattened already."""
    with _LOCK:
        COUNTS.launches += 1
    core_launch(stream, config, kernel, *flat)


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
    """The simulator's array over a ``DeviceArray``'s host memory: its pointer, shape and byte strides, no copy.

    What a GPU would fault on, or read and write past, and host memory would take raises ``ValueError``: an address
    or stride that is not a multiple of the item size, or a view reaching outside its tensor's storage.
    """
    from numba.cuda.simulator.cudadrv.devicearray import FakeCUDAArray

    if arg.size == 0:
        return FakeCUDAArray(np.empty(arg.shape, arg.dtype))
    if any(v % arg.dtype.itemsize for v in (arg.ptr, *(s for n, s in zip(arg.shape, arg.strides) if n > 1))):
        raise ValueError(f"compcoll: a {arg.dtype} kernel argument at address {arg.ptr:#x} (shape {arg.shape}, byte "
                         f"strides {arg.strides}) is not {arg.dtype.itemsize}-byte aligned: a GPU faults on it "
                         "(misaligned address), so the simulator refuses it")
    extent = arg.dtype.itemsize + sum((n - 1) * s for n, s in zip(arg.shape, arg.strides))
    if hasattr(arg.owner, "untyped_storage"):
        storage = arg.owner.untyped_storage()
        first, end = storage.data_ptr(), storage.data_ptr() + storage.nbytes()
        if not first <= arg.ptr <= arg.ptr + extent <= end:
            raise ValueError(f"compcoll: a kernel argument of {extent} bytes at byte {arg.ptr - first} of its tensor's "
                             f"{end - first} reaches outside it: on a GPU its kernel would read or write another "
                             "allocation (or fault), so the simulator refuses it")
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
    """values[:count] (None: all) on the host, counted as a wait, its seconds added to ``COUNTS.waited``; None on
    the ``TRACED`` stream (nothing waited for). A tensor's one value comes through ``item`` (no host tensor, view or
    slice made for it: the H200's profile at f15d93e put the view and slice at 4 us each a call, beside the copy's 28
    with the wait), more through ``tolist``."""
    with _LOCK:
        COUNTS.waits += 1
    recording = current()
    if recording is not None:
        recording.refuse("a value read to the host")
    if stream is TRACED:
        return None
    start = time.perf_counter()
    if isinstance(values, DeviceArray):
        owner = values.owner
        found = [owner.item()] if count == 1 and owner.numel() == 1 else owner.view(-1)[:count].tolist()
    else:
        host = values[:count].copy_to_host(stream=stream)
        if stream:
            stream.synchronize()
        found = host.tolist()
    waited = time.perf_counter() - start
    with _LOCK:
        COUNTS.waited += waited
    return found


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
