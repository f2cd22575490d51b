"""kernels.arrays: a DeviceArray's fields (what the bound launcher flattens), views and slices, on CPU tensors."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from compcoll.kernels.arrays import DeviceArray


def test_a_contiguous_view_has_c_strides() -> None:
    t = torch.zeros(5, 3, dtype=torch.float64)
    a = DeviceArray.of(t)
    assert (a.ptr, a.shape, a.strides, a.dtype, a.size, a.ndim) == (t.data_ptr(), (5, 3), (24, 8), np.float64, 15, 2)
    assert a.contiguous and a.__cuda_array_interface__["strides"] is None


def test_a_strided_view_keeps_its_byte_strides() -> None:
    t = torch.zeros(4, 10, dtype=torch.uint8)
    a = DeviceArray.of(t[:, 3:])
    assert (a.ptr, a.shape, a.strides) == (t.data_ptr() + 3, (4, 7), (10, 1))
    assert not a.contiguous and a.__cuda_array_interface__["strides"] == (10, 1)
    assert a.__cuda_array_interface__["typestr"] == "|u1"


def test_slice_and_view() -> None:
    t = torch.arange(6, dtype=torch.int16)
    a = DeviceArray.of(t)
    part = a[2:5]
    assert (part.ptr, part.shape, part.size) == (t.data_ptr() + 4, (3,), 3)
    assert torch.equal(part.owner, t[2:5])
    assert a.view(np.uint16).dtype == np.uint16 and a.view(np.uint16).ptr == a.ptr
    with pytest.raises(ValueError, match="differ in size"):
        a.view(np.float32)


def test_a_flat_view_is_what_viewing_then_wrapping_gives() -> None:
    t = torch.arange(12, dtype=torch.bfloat16).view(3, 4)
    flat, wrapped = DeviceArray.flat(t, np.uint16), DeviceArray.of(t.view(-1).view(torch.int16)).view(np.uint16)
    fields = ("ptr", "shape", "strides", "dtype")
    assert [getattr(flat, f) for f in fields] == [getattr(wrapped, f) for f in fields]
    assert flat.shape == (12,) and flat.contiguous and torch.equal(flat[5:7].owner, t.view(-1)[5:7])
    assert DeviceArray.flat(torch.zeros(2, 3)).dtype == np.float32
