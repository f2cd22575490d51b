"""The pre-bound launcher: each kernel variant compiled once per GPU, launched through ``cuda.core`` from raw pointers.

A launch's arguments select a compiled variant by their keys (``variant_key``: an array's dtype, rank and layout, a
scalar's type), and are flattened as numba-cuda lays out a kernel's parameters (``flattener``), so no launch types
an argument or wraps a tensor. This depends on numba-cuda's own parameter layout and on three private names
(``_Kernel._codelibrary``, its ``get_cufunc().kernel``, and ``driver._to_core_stream``), pinned in
``PINNED_NUMBA_CUDA`` and checked by ``scripts/cuda_ptx.py`` against every variant's PTX.
"""

from __future__ import annotations

import math
from functools import lru_cache

import numpy as np

from .arrays import DeviceArray

PINNED_NUMBA_CUDA = "0.30.4"
"""The numba-cuda whose parameter layout and private attributes the bound launcher uses."""


def variant_key(arg) -> tuple:
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
"""The key of a 1-D contiguous array, by dtype (``variant_key``)."""
_SCALAR_KEYS = {kind: ("scalar", kind) for kind in (bool, int, float, np.float32, np.float64, np.int64, np.uint64)}


def numba_type(key: tuple):
    """The numba type of an argument ``variant_key`` describes (what numba's dispatcher would type it as)."""
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
def bound_kernel(kernel, device: int, keys: tuple):
    """The cuda.core kernel of ``kernel``'s variant for ``keys`` on GPU ``device``, and its flatteners."""
    from numba import cuda

    argtypes = tuple(numba_type(k) for k in keys)
    with cuda.gpus[device]:
        compiled = kernel.compile(argtypes)
        return compiled._codelibrary.get_cufunc().kernel, tuple(flattener(t) for t in argtypes)


@lru_cache(maxsize=None)
def launch_config(grid: int, block: int):
    """cuda.core's launch shape of ``grid`` blocks of ``block`` threads, made once per shape."""
    from cuda.core import LaunchConfig

    return LaunchConfig(grid=grid, block=block)


@lru_cache(maxsize=None)
def core_stream(stream):
    """cuda.core's view of a numba stream (or 0: the default stream), made once per stream."""
    from numba.cuda.cudadrv import driver

    return driver._to_core_stream(stream)


def core_launch(stream, config, kernel, *args) -> None:
    """Launch a bound ``kernel`` with its flattened ``args`` in cuda.core's ``stream``, shaped by ``config``."""
    _core_launcher()(stream, config, kernel, *args)


@lru_cache(maxsize=None)
def _core_launcher():
    """``cuda.core.launch``, imported once (an import statement per launch costs a microsecond)."""
    from cuda.core import launch as core_launch

    return core_launch
