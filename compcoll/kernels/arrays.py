"""A view of device memory as a kernel argument: pointer, shape, byte strides and numpy dtype, no copy."""

from __future__ import annotations

import math

import numpy as np


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
