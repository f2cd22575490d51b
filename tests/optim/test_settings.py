"""optim.settings: a phase's length, the hyperparameters' checks, and the code of the groups every rank compares."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from compcoll.optim.settings import check_hyperparameters, hyperparameters, layout_settings, warmup_steps


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


@pytest.mark.parametrize("args, name", [(("a", (0.9, 0.99), 1e-8, 0.0), "lr"), ((None, (0.9, 0.99), 1e-8, 0.0), "lr"),
                                        ((1e-3, 0.9, 1e-8, 0.0), "betas"), ((1e-3, (0.9, "x"), 1e-8, 0.0), "betas"),
                                        ((1e-3, (0.9, 0.99), "1e-8", 0.0), "eps"),
                                        ((1e-3, (0.9, 0.99), 1e-8, True), "weight_decay")])
def test_a_hyperparameter_that_is_not_a_number_is_named(args: tuple, name: str) -> None:
    """Not a comparison's TypeError from deep inside the check."""
    with pytest.raises(ValueError, match=f"X: {name} must be"):
        check_hyperparameters("X", *args)
    check_hyperparameters("X", torch.tensor(1e-3), (0.9, 0.99), 1e-8, 0.0)


def test_the_layout_settings_are_checked() -> None:
    assert layout_settings("X", "auto", None) == {"ranks_per_node": "auto", "hierarchical": None}
    assert layout_settings("X", 4, True) == {"ranks_per_node": 4, "hierarchical": True}
    for ranks_per_node, hierarchical, message in ((0, None, "ranks_per_node must be"), ("x", None, "ranks_per_node"),
                                                  (True, None, "ranks_per_node"), (2, "yes", "hierarchical must be"),
                                                  (2, 1, "hierarchical must be")):
        with pytest.raises(ValueError, match=f"X: {message}"):
            layout_settings("X", ranks_per_node, hierarchical)


def test_a_phase_length_may_be_a_numpy_number() -> None:
    assert warmup_steps("X", "freeze_step", np.int64(7), None) == 7
    assert warmup_steps("X", "freeze_step", np.float64(0.25), 100) == 25


def test_a_phase_length_that_is_not_a_number_is_named() -> None:
    for value in ("a", None, True):
        with pytest.raises(ValueError, match="X: freeze_step must be a number of steps or a share"):
            warmup_steps("X", "freeze_step", value, 100)
