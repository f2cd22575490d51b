"""kernels.launch on the CPU: the launcher's choice, and the launch shapes a GPU's driver would refuse.

The counts under the simulator are checked by ``cuda_sim_checks`` (tests/kernels/test_cuda.py); the launches
themselves on a GPU (tests/gpu).
"""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Callable

import numpy as np
import pytest
import torch

from compcoll.kernels.arrays import DeviceArray
from compcoll.kernels.launch import (COUNTS, LAUNCHER_ENV, TRACED, launch, launcher, read_first, read_values,
                                     use_launcher)


@pytest.mark.parametrize("value, chosen", [(None, "bound"), ("numba", "numba"), ("bound", "bound")])
def test_the_launcher_is_chosen_by_the_environment_at_import(value: str | None, chosen: str) -> None:
    env = {k: v for k, v in os.environ.items() if k != LAUNCHER_ENV} | ({} if value is None else {LAUNCHER_ENV: value})
    found = subprocess.run([sys.executable, "-c", "from compcoll.kernels.launch import launcher; print(launcher())"],
                           env=env, capture_output=True, text=True, timeout=120)
    assert found.stdout.split() == [chosen], found.stderr


def test_a_launcher_the_environment_names_wrongly_is_refused_at_its_first_use() -> None:
    """A bad ``COMPCOLL_CUDA_LAUNCHER`` leaves ``import compcoll`` working and fails the first launch, naming it."""
    found = subprocess.run([sys.executable, "-c", "import compcoll\nfrom compcoll.kernels.launch import launcher\n"
                            "launcher()"], env=os.environ | {LAUNCHER_ENV: "fast"}, capture_output=True, text=True,
                           timeout=120)
    assert found.returncode != 0 and "COMPCOLL_CUDA_LAUNCHER='fast'; use one of" in found.stderr, found.stderr


def test_use_launcher_switches_the_process_and_names_the_one_before(choose_launcher: Callable[[str], None]) -> None:
    choose_launcher("bound")
    assert launcher() == "bound"
    assert use_launcher("numba") == "bound" and launcher() == "numba"
    with pytest.raises(ValueError, match="no launcher 'fast'; use one of"):
        use_launcher("fast")
    assert launcher() == "numba"


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


def test_a_host_read_adds_its_seconds_to_the_counts_and_a_traced_one_none() -> None:
    """``COUNTS.waited``: each host read (one value, or all) adds the seconds it took, which
    ``bench.clocks.own_host_seconds`` takes out of a call's host time; a read on the traced stream (meta tensors:
    nothing ran) is a wait counted but no time; ``reset`` clears it."""
    values = torch.tensor([2.5, -1.0, 7.0], dtype=torch.float64)
    COUNTS.reset()
    assert read_first(DeviceArray.flat(values[:1].clone()), None) == 2.5 and COUNTS.waits == 1
    first = COUNTS.waited
    assert read_values(DeviceArray.flat(values), None) == [2.5, -1.0, 7.0] and COUNTS.waits == 2
    assert 0.0 < first < COUNTS.waited
    seen = COUNTS.waited
    assert read_first(DeviceArray.flat(values), TRACED) == 1.0 and read_values(DeviceArray.flat(values), TRACED) is None
    assert COUNTS.waits == 4 and COUNTS.waited == seen
    COUNTS.reset()
    assert (COUNTS.waits, COUNTS.waited) == (0, 0.0)
