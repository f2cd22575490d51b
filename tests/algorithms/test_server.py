"""algorithms.server: the server's weights and this rank's scale on the device."""

from __future__ import annotations

import itertools
import warnings
from types import SimpleNamespace

import numpy as np
import torch

from compcoll import spec
from compcoll.algorithms.server import device_scalars, encode_worker, sums_scalars
from compcoll.workspace import Workspace


def test_device_scalars_are_the_weights_then_this_ranks_scale_and_warn_of_nothing() -> None:
    """``device_scalars``: float32(s_i) / n (correctly rounded, as ``codecs.divide_``) then this rank's own scale, in
    views of one workspace buffer; whatever its host buffer held before (a signalling NaN here, as fresh memory may
    hold, which numpy's division would warn of as an invalid value), no warning."""
    workspace, cpu = Workspace(), torch.device("cpu")
    workspace.get("scalars.host", 4, torch.float32, cpu).view(torch.int32).fill_(0x7FA00000)
    scales = np.array([0.1, 2.0, 1e-3])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        weights, mine = device_scalars(scales, 3, 0.25, cpu, workspace)
    expected = scales.astype(np.float32) / np.float32(3)
    assert weights.numpy().tobytes() == expected.tobytes() and mine.tolist() == [0.25]
    assert weights.data_ptr() + 12 == mine.data_ptr()


def test_the_encode_by_the_rounds_sums_is_the_encode_by_device_scalars() -> None:
    """``encode_worker`` on ``sums_scalars``' ``AgreedSums``, rank r's float64 sum at
    table[first + r * step] as a round on the device leaves them, gives the bits, error and weights it gives on
    ``device_scalars`` of the same senders' scales (``spec.scales_from``): for every rank, both scales, the senders in
    the rank order and in a transpose of it (the hierarchical allgather form's order, 2 ranks a node), on fresh
    random inputs."""
    rng = np.random.default_rng(3)
    numel, ranks, step, first, cpu = 1003, 4, 3, 5, torch.device("cpu")
    x = torch.from_numpy(rng.standard_normal(numel).astype(np.float32))
    table = torch.from_numpy(rng.random(first + ranks * step) * 10.0 ** rng.integers(-5, 5, first + ranks * step))
    agreement = SimpleNamespace(device_sums=lambda: (table, first, step))
    for scale, (senders, divisor) in itertools.product(("l2", "l1"), (([0, 1, 2, 3], 4), ([0, 2, 1, 3], 2))):
        scales = spec.scales_from(table.numpy()[first::step], 1008, scale)
        for me in range(ranks):
            error = torch.from_numpy((rng.standard_normal(1008) * 0.3).astype(np.float32))
            (bits_a, error_a), (bits_b, error_b) = ((torch.empty(126, dtype=torch.uint8), error.clone())
                                                    for _ in range(2))
            weights = encode_worker(x, error_a, sums_scalars(agreement, senders, divisor, cpu, Workspace()), me, scale,
                                    bits_a)
            held = device_scalars(scales[senders].astype(np.float64), divisor, float(scales[me]), cpu, Workspace())
            expected = encode_worker(x, error_b, held, me, scale, bits_b)
            assert torch.equal(bits_a, bits_b) and torch.equal(error_a, error_b), (scale, senders, me)
            assert weights.numpy().tobytes() == expected.numpy().tobytes(), (scale, senders, me)
