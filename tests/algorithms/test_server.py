"""algorithms.server: the server's weights and this rank's scale on the device."""

from __future__ import annotations

import warnings

import numpy as np
import torch

from compcoll.algorithms.server import device_scalars
from compcoll.workspace import Workspace


def test_device_scalars_are_the_weights_then_this_ranks_scale_and_warn_of_nothing() -> None:
    """``device_scalars``: float32(s_i) / n (correctly rounded, as ``codecs.divide_``) then this rank's own scale, in
    views of one workspace buffer; whatever its host buffer held before (a signalling NaN here, as fresh memory may
    hold, which numpy's division would warn of as an invalid value), no warning."""
    workspace, cpu = Workspace(), torch.device("cpu")
    workspace.get("scalars.host", 4, torch.float32, cpu).view(torch.int32).fill_(0x7FA00000)
    scales = torch.tensor([0.1, 2.0, 1e-3], dtype=torch.float64)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        weights, mine = device_scalars(scales, 3, 0.25, cpu, workspace)
    expected = scales.numpy().astype(np.float32) / np.float32(3)
    assert weights.numpy().tobytes() == expected.tobytes() and mine.tolist() == [0.25]
    assert weights.data_ptr() + 12 == mine.data_ptr()
