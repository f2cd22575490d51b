"""optim.silent: the coordinates of a zero variance, and their zeroings skipped on the host where none is."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import compcoll
from compcoll.optim import onebit_adam, onebit_lamb, silent, zero_one_adam


def test_silent_coordinates_are_the_zeros_of_the_variance_or_none() -> None:
    """On the host: None where every element is positive (and for no element), the mask ``v == 0`` where one is
    zero or NaN (whose minimum is not positive); on a device (meta stands in: no value to read) always the mask, with
    no read of the minimum."""
    rng = np.random.default_rng(43)
    v = torch.from_numpy(rng.random(1003).astype(np.float32) + 1e-30)
    assert silent.silent_coordinates(v) is None
    assert silent.silent_coordinates(torch.empty(0)) is None
    for at in ([0], [1002], [5, 77, 500]):
        w = v.clone()
        w[at] = 0.0
        assert torch.equal(silent.silent_coordinates(w), w == 0)
    w = v.clone()
    w[9] = float("nan")
    assert torch.equal(silent.silent_coordinates(w), torch.zeros(1003, dtype=torch.bool))
    meta = silent.silent_coordinates(torch.empty(7, device="meta"))
    assert meta.device.type == "meta" and meta.dtype == torch.bool
    x = torch.from_numpy(rng.standard_normal(1003).astype(np.float32))
    assert silent.zero_where(x, None) is x and torch.equal(silent.zero_where(x.clone(), v == 0), x)
    w = v.clone()
    w[[3, 4]] = 0.0
    assert silent.zero_where(x.clone(), w == 0)[[3, 4]].tolist() == [0.0, 0.0]


def _trained(make: str, masked: bool, monkeypatch: pytest.MonkeyPatch) -> list[torch.Tensor]:
    """A small model's parameters after 9 steps of the optimizer ``make`` (its compressed steps from the third) on
    fresh random gradients with no zero, on one rank; ``masked``: every step takes the mask ``v == 0`` (all False),
    as before the zeroings were skipped."""
    if masked:
        for module in (onebit_adam, onebit_lamb, zero_one_adam):
            monkeypatch.setattr(module, "silent_coordinates", lambda v: v == 0)
    model = _model()
    kw = {"lr": 1e-2, "comm": compcoll.SingleComm()}
    opt = {"adam": lambda: compcoll.optim.OneBitAdam(model.parameters(), freeze_step=2, **kw),
           "adam_momentum": lambda: compcoll.optim.OneBitAdam(model.parameters(), freeze_step=2, compress="momentum",
                                                              **kw),
           "lamb": lambda: compcoll.optim.OneBitLamb(model.parameters(), freeze_step=2, **kw),
           "zeroone": lambda: compcoll.optim.ZeroOneAdam(model.parameters(), var_freeze_step=2, local_step_scaler=2,
                                                         **kw)}[make]()
    rng = np.random.default_rng(47)
    for _ in range(9):
        for p in model.parameters():
            p.grad = torch.from_numpy(rng.standard_normal(tuple(p.shape)).astype(np.float32))
        opt.step()
    monkeypatch.undo()
    return [p.detach().clone() for p in model.parameters()]


@pytest.mark.parametrize("make", ["adam", "adam_momentum", "lamb", "zeroone"])
def test_skipping_the_zeroings_leaves_every_bit(make: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """An optimizer whose variance has no zero skips its zeroings on the host (``silent_coordinates`` None), and
    ends with the bits of the same run zeroing by an all-False mask."""
    assert silent.silent_coordinates(torch.ones(3)) is None
    skipped, masked = _trained(make, False, monkeypatch), _trained(make, True, monkeypatch)
    assert all(torch.equal(a, b) for a, b in zip(skipped, masked))
    assert not all(torch.equal(a, p) for a, p in zip(skipped, _model().parameters()))


def _model() -> torch.nn.Module:
    """The small model ``_trained`` trains, as it starts."""
    torch.manual_seed(5)
    return torch.nn.Sequential(torch.nn.Linear(13, 11), torch.nn.Linear(11, 7))
