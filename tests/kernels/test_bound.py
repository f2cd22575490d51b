"""kernels.bound on the CPU: the keys that select a kernel variant.

The parameter layout against each variant's PTX, and the numba-cuda pin, are checked by ``scripts/cuda_ptx.py``
(tests/kernels/test_cuda_ptx.py); the launches themselves on a GPU (tests/gpu).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from compcoll.kernels.arrays import DeviceArray
from compcoll.kernels.bound import variant_key


@pytest.mark.parametrize("shape, step", [((0,), 1), ((1,), 1), ((7,), 1), ((7,), 2), ((1,), 3), ((3, 5), 1),
                                         ((3, 5), 2), ((4, 1), 1), ((1, 4), 2)])
def test_each_views_variant_key_is_its_dtype_rank_and_layout(shape: tuple[int, ...], step: int) -> None:
    """A view's key (which takes a short way for 1-D contiguous views at every launch) is what its fields give, however
    the view was made; scalars' keys are their types."""
    base = torch.zeros(shape)
    strided = base[::step] if base.dim() == 1 else base[:, ::step]
    views = [DeviceArray.of(strided), DeviceArray.of(strided).view(np.int32), DeviceArray(
        strided.data_ptr(), tuple(strided.shape), tuple(s * 4 for s in strided.stride()), np.dtype(np.float32),
        strided)]
    if strided.is_contiguous():
        views.append(DeviceArray.flat(strided))
    for view in views:
        assert variant_key(view) == ("array", view.dtype, view.ndim, view.contiguous)
    assert [variant_key(v) for v in (True, 3, 0.5, np.float32(1), np.uint64(2))] == [
        ("scalar", bool), ("scalar", int), ("scalar", float), ("scalar", np.float32), ("scalar", np.uint64)]
