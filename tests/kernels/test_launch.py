"""kernels.launch on the CPU: DeviceArray's fields (what the bound launcher flattens) and the launcher's choice.

The parameter layout against each variant's PTX, and the numba-cuda pin, are checked by
``scripts/cuda_ptx.py`` (tests/kernels/test_cuda_ptx.py); the counts under the simulator by
``cuda_sim_checks`` (tests/kernels/test_cuda.py); the launches themselves on a GPU (tests/gpu).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from compcoll.kernels.launch import LAUNCHER_ENV, DeviceArray, _key, launcher


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


@pytest.mark.parametrize("shape, step", [((0,), 1), ((1,), 1), ((7,), 1), ((7,), 2), ((1,), 3), ((3, 5), 1),
                                         ((3, 5), 2), ((4, 1), 1), ((1, 4), 2)])
def test_each_views_variant_key_is_its_dtype_rank_and_layout(shape: tuple[int, ...], step: int) -> None:
    """A view's key (``_key``, which takes a short way for 1-D contiguous views at every launch) is what its fields
    give, however the view was made; scalars' keys are their types."""
    base = torch.zeros(shape)
    strided = base[::step] if base.dim() == 1 else base[:, ::step]
    views = [DeviceArray.of(strided), DeviceArray.of(strided).view(np.int32), DeviceArray(
        strided.data_ptr(), tuple(strided.shape), tuple(s * 4 for s in strided.stride()), np.dtype(np.float32),
        strided)]
    if strided.is_contiguous():
        views.append(DeviceArray.flat(strided))
    for view in views:
        assert _key(view) == ("array", view.dtype, view.ndim, view.contiguous)
    assert [_key(v) for v in (True, 3, 0.5, np.float32(1), np.uint64(2))] == [
        ("scalar", bool), ("scalar", int), ("scalar", float), ("scalar", np.float32), ("scalar", np.uint64)]


def test_the_launcher_is_chosen_by_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(LAUNCHER_ENV, raising=False)
    assert launcher() == "bound"
    monkeypatch.setenv(LAUNCHER_ENV, "numba")
    assert launcher() == "numba"
    monkeypatch.setenv(LAUNCHER_ENV, "fast")
    with pytest.raises(ValueError, match="COMPCOLL_CUDA_LAUNCHER='fast'"):
        launcher()
