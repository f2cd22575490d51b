"""kernels.launch on the CPU: the launcher's choice, and the launch shapes a GPU's driver would refuse.

The counts under the simulator are checked by ``cuda_sim_checks`` (tests/kernels/test_cuda.py); the launches
themselves on a GPU (tests/gpu).
"""

from __future__ import annotations

import numpy as np
import pytest

from compcoll.kernels.arrays import DeviceArray
from compcoll.kernels.launch import LAUNCHER_ENV, TRACED, launch, launcher


def test_the_launcher_is_chosen_by_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(LAUNCHER_ENV, raising=False)
    assert launcher() == "bound"
    monkeypatch.setenv(LAUNCHER_ENV, "numba")
    assert launcher() == "numba"
    monkeypatch.setenv(LAUNCHER_ENV, "fast")
    with pytest.raises(ValueError, match="COMPCOLL_CUDA_LAUNCHER='fast'"):
        launcher()


@pytest.mark.parametrize("grid, block", [(0, 128), (1, 0), (1, 1025), (2 ** 31, 1)])
def test_a_launch_shape_a_gpu_would_refuse_is_refused_where_nothing_checks_it(grid: int, block: int) -> None:
    """On the traced stream (the counts on meta tensors) and under numba's simulator nothing else would refuse a
    launch that a GPU's driver refuses, so ``launch`` does, naming the kernel; a shape a GPU takes is counted."""
    from compcoll.kernels.cuda import records

    total, out = (DeviceArray(0, (1,), (8,), np.dtype(np.float64), None),
                  DeviceArray(0, (1,), (4,), np.dtype(np.float32), None))
    launch(records._scale_of, 1, 1, TRACED, total, 8, 8.0 ** 0.5, True, out)
    with pytest.raises(ValueError, match=f"kernel _scale_of launched on {grid} blocks of {block} threads: a GPU takes"):
        launch(records._scale_of, grid, block, TRACED, total, 8, 8.0 ** 0.5, True, out)
