"""DeepSpeed's warm-up schedules as torch schedulers: DeepSpeed's learning rates step for step, and its configs."""

from __future__ import annotations

import json
import logging
import math
import warnings
from pathlib import Path

import pytest
import torch

import compcoll
from compcoll.launcher import run_threads
from compcoll.optim import OneBitAdam, from_deepspeed_config, scheduler_from_deepspeed_config
from compcoll.optim import schedules

CASES = [
    ("WarmupLR", {}),
    ("WarmupLR", dict(warmup_num_steps=7, warmup_type="linear", warmup_min_lr=1e-4)),
    ("WarmupLR", dict(warmup_num_steps=13, warmup_min_lr=[1e-5, 2e-5], warmup_max_lr=[0.01, 0.02])),
    ("WarmupLR", dict(warmup_num_steps=1)),
    ("WarmupDecayLR", dict(total_num_steps=40, warmup_num_steps=9)),
    ("WarmupDecayLR", dict(total_num_steps=37, warmup_num_steps=11, warmup_type="linear", warmup_min_lr=3e-4,
                           warmup_max_lr=3e-3)),
    ("WarmupDecayLR", dict(total_num_steps=5, warmup_num_steps=9)),
    ("WarmupCosineLR", dict(total_num_steps=45, warmup_num_steps=10)),
    ("WarmupCosineLR", dict(total_num_steps=33, warmup_num_steps=6, warmup_type="linear", warmup_min_ratio=0.1,
                            cos_min_ratio=0.05)),
    ("WarmupCosineLR", dict(total_num_steps=4, warmup_num_steps=8)),
]
"""Each schedule with its defaults, both curves, per-group values, a one-step warm-up and a run shorter than it."""


def _optimizer() -> torch.optim.Optimizer:
    """SGD over two parameter groups of their own learning rates."""
    first, second = torch.nn.Linear(3, 3), torch.nn.Linear(3, 2)
    return torch.optim.SGD([{"params": first.parameters(), "lr": 0.3}, {"params": second.parameters(), "lr": 0.07}])


def _rates(make, steps: int = 60, optimizer: torch.optim.Optimizer | None = None) -> list[list[float]]:
    """The groups' learning rates at each of ``steps`` optimizer steps, the schedule stepped after each, as
    DeepSpeed's engine steps it."""
    optimizer = optimizer or _optimizer()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        scheduler = make(optimizer)
    rates = []
    for _ in range(steps):
        rates.append([group["lr"] for group in optimizer.param_groups])
        optimizer.step()
        scheduler.step()
    return rates


@pytest.mark.parametrize("kind, params", CASES)
def test_learning_rates_equal_deepspeeds_own(kind: str, params: dict) -> None:
    """DeepSpeed 0.19.6's own schedule (deepspeed.runtime.lr_schedules) gives the same floats at every step."""
    ours = _rates(lambda opt: getattr(schedules, kind)(opt, **params))
    pytest.importorskip("deepspeed")
    from deepspeed.runtime import lr_schedules

    logging.disable(logging.WARNING)
    try:
        theirs = _rates(lambda opt: getattr(lr_schedules, kind)(opt, **params))
    finally:
        logging.disable(logging.NOTSET)
    assert ours == theirs


ONE_CYCLE = [
    dict(cycle_min_lr=1e-4, cycle_max_lr=1e-3, cycle_first_step_size=10),
    dict(cycle_min_lr=[1e-4, 2e-4], cycle_max_lr=[1e-3, 3e-3], cycle_first_step_size=7, cycle_second_step_size=12,
         decay_lr_rate=0.1, decay_step_size=3, decay_mom_rate=0.05, cycle_min_mom=[0.85, 0.8], cycle_max_mom=0.95),
    dict(cycle_min_lr=1e-4, cycle_max_lr=1e-3, cycle_first_step_size=9, cycle_first_stair_count=3,
         cycle_second_stair_count=2, decay_step_size=5, decay_lr_rate=0.5),
    dict(cycle_min_lr=1e-4, cycle_max_lr=1e-3, cycle_first_step_size=5, cycle_second_step_size=0),
    dict(cycle_min_lr=1e-4, cycle_max_lr=1e-3, cycle_first_step_size=6, cycle_momentum=False),
]
"""OneCycle with its defaults, per-group values, both decays, stairs, a cycle without its second half, no momentum."""


def _lrs_and_betas(make, steps: int = 60) -> list[list[tuple]]:
    """Each optimizer step's (lr, betas) per group of a torch Adam over two groups, the schedule stepped after each."""
    first, second = torch.nn.Linear(3, 3), torch.nn.Linear(3, 2)
    optimizer = torch.optim.Adam([{"params": first.parameters(), "lr": 0.3}, {"params": second.parameters()}])
    scheduler = make(optimizer)
    seen = []
    for _ in range(steps):
        seen.append([(group["lr"], tuple(group["betas"])) for group in optimizer.param_groups])
        optimizer.step()
        scheduler.step()
    return seen


@pytest.mark.parametrize("params", ONE_CYCLE)
def test_one_cycle_equals_deepspeeds_own(params: dict) -> None:
    """DeepSpeed 0.19.6's own OneCycle sets the same learning rates and betas at every step."""
    ours = _lrs_and_betas(lambda opt: schedules.OneCycle(opt, **params))
    pytest.importorskip("deepspeed")
    from deepspeed.runtime import lr_schedules

    assert ours == _lrs_and_betas(lambda opt: lr_schedules.OneCycle(opt, **params))


def test_one_cycle_follows_deepspeeds_formulas() -> None:
    """Without DeepSpeed: the cycle's ends, its midpoints and the decay at chosen steps (step i + 1 at it = i - 1)."""
    seen = _lrs_and_betas(lambda opt: schedules.OneCycle(opt, 0.001, 0.01, cycle_first_step_size=10,
                                                         decay_step_size=2, decay_lr_rate=0.5), 30)
    scale = (1. + 1 / 20 - 1) / (10 / 20)  # batch 1 of a 20-batch cycle rising for 10: x / r
    assert seen[0][0] == (0.001, (0.8, 0.99)) and seen[1][0] == (0.001 + (0.01 - 0.001) * scale,
                                                                 (0.9 - (0.9 - 0.8) * scale, 0.99))
    assert seen[10][0] == (0.001 + (0.01 - 0.001) * 1.0, (0.9 - (0.9 - 0.8) * 1.0, 0.99))  # the top, it = 9
    assert seen[20][0] == (0.001, (0.9, 0.99))  # the cycle's end, it = 19
    assert seen[25][0] == (0.001 / (1 + 0.5 * ((24 - 20.0 + 1) / 2)), (0.9, 0.99))  # decaying, it = 24


def test_learning_rates_follow_deepspeeds_formulas() -> None:
    """Without DeepSpeed: the rates at chosen steps, from the formulas of DeepSpeed's docstrings, in its order of
    operations (the rates of optimizer step i + 1 at DeepSpeed's iteration it = i - 1; the first sees the start)."""
    warm = _rates(lambda opt: schedules.WarmupLR(opt, warmup_max_lr=0.01, warmup_num_steps=10), 14)
    assert [rates[0] for rates in warm[:3]] == [0.0, 0.0, 0.0 + 0.01 * ((1.0 / math.log(10)) * math.log(2))]
    assert warm[11] == warm[13] == [0.01, 0.01] and warm[10][0] < 0.01
    decay = _rates(lambda opt: schedules.WarmupDecayLR(opt, 20, warmup_min_lr=0.001, warmup_max_lr=0.002,
                                                       warmup_num_steps=10, warmup_type="linear"), 25)
    assert decay[1][0] == 0.001 and decay[7][0] == 0.001 + (0.002 - 0.001) * (6 / 10)
    assert decay[17][0] == 0.001 + (0.002 - 0.001) * ((20 - 16) / 10) and decay[22][0] == decay[24][0] == 0.001
    cosine = _rates(lambda opt: schedules.WarmupCosineLR(opt, 30, warmup_num_steps=10, cos_min_ratio=0.0), 40)
    assert cosine[0] == [0.0, 0.0] and cosine[12][0] == 0.3 * ((1 + math.cos(math.pi * (2 / 20))) / 2)
    assert cosine[31][0] == 0.0 and cosine[39] == [0.0, 0.0]


def test_a_schedule_resumes_from_its_state_dict() -> None:
    """Saved after 17 steps and loaded, as torch's schedulers are, into an optimizer and a schedule built afresh (both
    built, then both loaded): the next rates are the uninterrupted run's."""
    whole = _rates(lambda opt: schedules.WarmupCosineLR(opt, 40, warmup_num_steps=8), 30)
    optimizer = _optimizer()
    scheduler = schedules.WarmupCosineLR(optimizer, 40, warmup_num_steps=8)
    for _ in range(17):
        optimizer.step()
        scheduler.step()
    saved = scheduler.state_dict(), optimizer.state_dict()
    resumed = _optimizer()
    again = schedules.WarmupCosineLR(resumed, 40, warmup_num_steps=8)
    resumed.load_state_dict(saved[1])
    again.load_state_dict(saved[0])
    rates = []
    for _ in range(13):
        rates.append([group["lr"] for group in resumed.param_groups])
        resumed.step()
        again.step()
    assert rates == whole[17:]


def test_configs_build_schedules_and_refuse_what_does_not_carry_over(tmp_path: Path) -> None:
    """A config's scheduler section (a dict or a JSON file): DeepSpeed's warm-up schedules, a torch scheduler by
    name (the engine's fallback), and a clear ValueError for the rest."""
    config = {"scheduler": {"type": "WarmupDecayLR", "params": {"total_num_steps": 40, "warmup_num_steps": 9}}}
    path = tmp_path / "ds_config.json"
    path.write_text(json.dumps(config))
    direct = _rates(lambda opt: schedules.WarmupDecayLR(opt, 40, warmup_num_steps=9), 45)
    assert _rates(lambda opt: scheduler_from_deepspeed_config(path, opt), 45) == direct
    step_lr = {"scheduler": {"type": "StepLR", "params": {"step_size": 3, "gamma": 0.5}}}
    assert [r[0] for r in _rates(lambda opt: scheduler_from_deepspeed_config(step_lr, opt), 7)] == \
        [0.3, 0.3, 0.3, 0.15, 0.15, 0.15, 0.075]
    for section, message in (
        ({"type": "LRRangeTest", "params": {}}, "LRRangeTest is not carried over: a learning-rate search"),
        ({"type": "WarmupLR", "params": {"warmup_steps": 5}}, "param(s) 'warmup_steps' not taken by WarmupLR"),
        ({"type": "WarmupLR", "params": {"last_batch_iteration": 5}}, "resume a schedule through its state_dict"),
        ({"type": "warmuplr"}, "'warmuplr' is neither one of DeepSpeed's"),
        ({"type": "Optimizer"}, "'Optimizer' is neither"),
        ({"params": {}}, 'no "scheduler" section with a "type"'),
        ({"type": "WarmupLR", "params": {"warmup_num_steps": 0}}, "warmup_num_steps must be a positive integer"),
        ({"type": "WarmupLR", "params": {"warmup_min_lr": [0.1]}}, "expected 2 values (one per parameter group)"),
    ):
        with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
            scheduler_from_deepspeed_config({"scheduler": section}, _optimizer())


def test_a_config_schedules_a_compressed_optimizer_alike_on_every_rank() -> None:
    """from_deepspeed_config's OneBitAdam driven by the config's WarmupLR on 2 ranks: each step takes the schedule's
    rate (every rank's agreed: the step's round carries the groups' hyperparameters) and replicas stay equal."""
    config = {"optimizer": {"type": "OneBitAdam", "params": {"lr": 1e-3, "freeze_step": 3}},
              "scheduler": {"type": "WarmupLR", "params": {"warmup_num_steps": 5, "warmup_type": "linear"}}}
    finals = {}

    def rank(comm: compcoll.Communicator) -> None:
        torch.manual_seed(0)
        model = torch.nn.Linear(6, 4)
        optimizer = from_deepspeed_config(config, model.parameters(), comm)
        scheduler = scheduler_from_deepspeed_config(config, optimizer)
        assert isinstance(optimizer, OneBitAdam)
        gen = torch.Generator().manual_seed(comm.rank)
        rates = []
        for _ in range(8):
            rates.append(optimizer.param_groups[0]["lr"])
            optimizer.zero_grad()
            model(torch.randn(5, 6, generator=gen)).square().mean().backward()
            optimizer.step()
            scheduler.step()
        assert rates == [0.0, 0.0, 2e-4, 4e-4, 6e-4, 8e-4, 1e-3, 1e-3], rates
        finals[comm.rank] = torch.cat([p.detach().reshape(-1) for p in model.parameters()])

    run_threads(rank, 2)
    assert torch.equal(finals[0], finals[1])


def test_one_cycle_drives_a_compressed_optimizers_betas_alike_on_every_rank() -> None:
    """A config's OneCycle over OneBitAdam on 2 ranks, through its compressed steps: every step trains with the
    schedule's b1 (a run that does not cycle the momentum ends elsewhere) and replicas stay equal."""
    finals = {}

    def rank(comm: compcoll.Communicator, cycle: bool) -> None:
        config = {"optimizer": {"type": "OneBitAdam", "params": {"lr": 1e-3, "freeze_step": 3}},
                  "scheduler": {"type": "OneCycle", "params": {"cycle_min_lr": 1e-4, "cycle_max_lr": 1e-3,
                                                               "cycle_first_step_size": 4, "cycle_momentum": cycle}}}
        torch.manual_seed(0)
        model = torch.nn.Linear(6, 4)
        optimizer = from_deepspeed_config(config, model.parameters(), comm)
        scheduler = scheduler_from_deepspeed_config(config, optimizer)
        gen = torch.Generator().manual_seed(comm.rank)
        for _ in range(8):
            optimizer.zero_grad()
            model(torch.randn(5, 6, generator=gen)).square().mean().backward()
            optimizer.step()
            scheduler.step()
        finals[cycle, comm.rank] = torch.cat([p.detach().reshape(-1) for p in model.parameters()])

    for cycle in (True, False):
        run_threads(rank, 2, args=(cycle,))
    assert torch.equal(finals[True, 0], finals[True, 1]) and torch.equal(finals[False, 0], finals[False, 1])
    assert not torch.equal(finals[True, 0], finals[False, 0]), "the cycled betas did not reach the steps"
