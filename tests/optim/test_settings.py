"""optim.settings: a phase's length, the hyperparameters' checks, and the code of the groups every rank compares."""

from __future__ import annotations

import pytest
import torch

from compcoll.optim.settings import check_hyperparameters, hyperparameters, warmup_steps


def test_a_phase_is_a_count_or_a_share_of_the_run() -> None:
    assert warmup_steps("X", "freeze_step", 7, None) == 7
    assert warmup_steps("X", "freeze_step", 7.0, None) == 7
    assert warmup_steps("X", "freeze_step", 0.15, 61) == 9
    for value, total, message in ((0.5, None, "pass total_steps"), (0.5, True, "pass total_steps"),
                                  (True, 10, "number of steps"), (2.5, 10, "number of steps"),
                                  (0.01, 10, "at least 1 step")):
        with pytest.raises(ValueError, match=message):
            warmup_steps("X", "freeze_step", value, total, least=1)


def test_the_first_bad_hyperparameter_is_named() -> None:
    check_hyperparameters("X", 0.0, (0.0, 0.999), None, 0.0)
    cases = (((-1e-3, (0.9, 0.99), 1e-8, 0.0), "lr"), ((float("nan"), (0.9, 0.99), 1e-8, 0.0), "lr"),
             ((1e-3, (0.9, 1.0), 1e-8, 0.0), "betas"), ((1e-3, (0.9,), 1e-8, 0.0), "betas"),
             ((1e-3, (0.9, 0.99), 0.0, 0.0), "eps"), ((1e-3, (0.9, 0.99), 1e-8, -0.1), "weight_decay"))
    for args, name in cases:
        with pytest.raises(ValueError, match=f"X: {name} must"):
            check_hyperparameters("X", *args)


def test_the_groups_code_covers_plain_values_only() -> None:
    """Equal plain hyperparameters give one code whatever the params and key order; a changed value another; a
    value without a plain form (an object, a large tensor) counts as absent, since its repr differs by rank."""
    def code(groups: list[dict]) -> int:
        return hyperparameters(groups).code

    groups = [{"params": [torch.zeros(2)], "lr": 1e-3, "betas": (0.9, 0.999), "scale": torch.tensor([2.0])}]
    reordered = {"betas": [0.9, 0.999], "scale": torch.tensor([2.0]), "lr": 1e-3, "params": []}
    assert code([reordered]) == code(groups)
    assert code([{**groups[0], "lr": 2e-3}]) != code(groups)
    assert code([{**groups[0], "hook": object()}]) == code(groups)
    assert code([{**groups[0], "big": torch.zeros(17)}]) == code(groups)
    assert code(groups + groups) != code(groups)
