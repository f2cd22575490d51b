"""DeepSpeed 0.19.6's learning-rate schedules (OneCycle's betas too) as torch LR schedulers, for its configs."""

from __future__ import annotations

import math
import warnings
from typing import Any, Sequence

import torch
from torch.optim.lr_scheduler import LRScheduler

LOG, LINEAR = "log", "linear"
"""DeepSpeed's warm-up curves: log(it + 1) / log(N), or it / N."""


class WarmupLR(LRScheduler):
    """DeepSpeed's ``WarmupLR``: from ``warmup_min_lr`` to ``warmup_max_lr`` over ``warmup_num_steps``, then flat.

    DeepSpeed counts its iterations from -1 (``last_batch_iteration``) and its engine steps the
    schedule after every optimizer step; torch's schedulers count from 0 and step once when
    built. So iteration ``it`` = ``last_epoch`` - 1, and with ``step()`` after every
    ``optimizer.step()`` the optimizer sees DeepSpeed's learning rates step for step:
    1. it < 0 (the first optimizer step): ``warmup_min_lr``.
    2. it < N (N = max(2, ``warmup_num_steps``)): min + (max - min) * gamma, gamma =
       log(it + 1) / log(N) ("log", DeepSpeed's default) or it / N ("linear").
    3. After: ``warmup_max_lr``.
    The same float operations as DeepSpeed's, so the same bits. ``warmup_min_lr`` and ``warmup_max_lr`` take one
    value per parameter group or one for all; ``warmup_max_lr=None`` is each group's lr when built.
    """

    def __init__(self, optimizer: torch.optim.Optimizer, warmup_min_lr: float | Sequence[float] = 0.0,
                 warmup_max_lr: float | Sequence[float] | None = None, warmup_num_steps: int = 1000,
                 warmup_type: str = LOG) -> None:
        self.warmup_num_steps, self.warmup_type, self.inverse_log_warm_up = _warmup_settings(warmup_num_steps,
                                                                                             warmup_type)
        groups = [group["lr"] for group in optimizer.param_groups]
        self.min_lrs = _per_group(optimizer, warmup_min_lr, "warmup_min_lr")
        self.max_lrs = _per_group(optimizer, groups if warmup_max_lr is None else warmup_max_lr, "warmup_max_lr")
        self.delta_lrs = [big - small for big, small in zip(self.max_lrs, self.min_lrs)]
        super().__init__(optimizer)

    def get_lr(self) -> list[float]:
        """The groups' learning rates at DeepSpeed's iteration ``last_epoch`` - 1."""
        it = self.last_epoch - 1
        if it < 0:
            return list(self.min_lrs)
        gamma = self._gamma(it)
        return [min_lr + (delta_lr * gamma) for min_lr, delta_lr in zip(self.min_lrs, self.delta_lrs)]

    def _gamma(self, it: int) -> float:
        if it < self.warmup_num_steps:
            return _warmup(self.warmup_type, self.inverse_log_warm_up, it, self.warmup_num_steps)
        return 1.0


class WarmupDecayLR(WarmupLR):
    """DeepSpeed's ``WarmupDecayLR``: ``WarmupLR``'s warm-up, then a linear decay to 0 at ``total_num_steps``.

    After the warm-up gamma = max(0, (T - it) / max(1, T - N)), T = ``total_num_steps``.
    ``warmup_max_lr`` defaults to 0.001, as DeepSpeed's does (not the groups' lr).
    """

    def __init__(self, optimizer: torch.optim.Optimizer, total_num_steps: int,
                 warmup_min_lr: float | Sequence[float] = 0.0, warmup_max_lr: float | Sequence[float] = 0.001,
                 warmup_num_steps: int = 1000, warmup_type: str = LOG) -> None:
        self.total_num_steps = _positive("total_num_steps", total_num_steps)
        super().__init__(optimizer, warmup_min_lr, warmup_max_lr, warmup_num_steps, warmup_type)
        _warn_short(total_num_steps, self.warmup_num_steps)

    def _gamma(self, it: int) -> float:
        if it < self.warmup_num_steps:
            return _warmup(self.warmup_type, self.inverse_log_warm_up, it, self.warmup_num_steps)
        rest = float(max(1.0, self.total_num_steps - self.warmup_num_steps))
        return max(0.0, float(self.total_num_steps - it) / rest)


class WarmupCosineLR(LRScheduler):
    """DeepSpeed's ``WarmupCosineLR``: each group's lr when built times a ratio.

    1. it < 0 (the first optimizer step): 0.
    2. it < N: ``warmup_min_ratio`` + gamma * (1 - ``warmup_min_ratio``), gamma as ``WarmupLR``'s.
    3. After: max(0, c + (1 - c) * (1 + cos(pi * min(1, p))) / 2), c = ``cos_min_ratio``,
       p = (it - N + 1) / max(1, T - N), T = ``total_num_steps``.
    """

    def __init__(self, optimizer: torch.optim.Optimizer, total_num_steps: int, warmup_min_ratio: float = 0.0,
                 warmup_num_steps: int = 1000, cos_min_ratio: float = 0.0001, warmup_type: str = LOG) -> None:
        self.warmup_num_steps, self.warmup_type, self.inverse_log_warm_up = _warmup_settings(warmup_num_steps,
                                                                                             warmup_type)
        self.total_num_steps = _positive("total_num_steps", total_num_steps)
        self.cos_min_ratio = cos_min_ratio
        self.warmup_min_ratio = warmup_min_ratio
        _warn_short(total_num_steps, self.warmup_num_steps)
        self.org_lrs = [group["lr"] for group in optimizer.param_groups]
        super().__init__(optimizer)

    def get_lr(self) -> list[float]:
        """The groups' learning rates at DeepSpeed's iteration ``last_epoch`` - 1."""
        it = self.last_epoch - 1
        if it < 0:
            return [0.0 for _ in self.org_lrs]
        ratio = self._ratio(it)
        return [org_lr * ratio for org_lr in self.org_lrs]

    def _ratio(self, it: int) -> float:
        if it < self.warmup_num_steps:
            ratio = _warmup(self.warmup_type, self.inverse_log_warm_up, it, self.warmup_num_steps)
            return self.warmup_min_ratio + ratio * (1. - self.warmup_min_ratio)
        real_last_step = it - self.warmup_num_steps + 1
        real_total_steps = max(1, self.total_num_steps - self.warmup_num_steps)
        progress = min(1.0, real_last_step / real_total_steps)
        ratio = (1 + math.cos(math.pi * progress)) / 2
        return max(0.0, self.cos_min_ratio + (1. - self.cos_min_ratio) * ratio)


class OneCycle(LRScheduler):
    """DeepSpeed's ``OneCycle``: one cycle of the learning rate up and down (the momentum, b1, down and up), then
    an optional decay.

    At iteration ``it`` = ``last_epoch`` - 1 (as ``WarmupLR``), with S1 = ``cycle_first_step_size``,
    S2 = ``cycle_second_step_size`` (None: S1) and T = S1 + S2:
    1. it < 0 (the first optimizer step): ``cycle_min_lr``, and betas (``cycle_min_mom``, 0.99).
    2. it < T: the position x = 1 + (it + 1) / T - floor(1 + (it + 1) / T) in the cycle gives a
       scale s = x / r (r = S1 / T) while x <= r, else (x - 1) / (r - 1); with a stair count
       k > 0 for that half, s = floor(k * (steps into the half) / its length) / k. lr =
       min + (max - min) s; b1 = ``cycle_max_mom`` - (max - min momentum) s.
    3. After, with ``decay_step_size`` D > 0: lr = min / (1 + ``decay_lr_rate`` * i / D) and
       b1 = ``cycle_max_mom`` * (1 + ``decay_mom_rate`` * i / D), i = it - T + 1; a rate of 0
       (or D = 0) holds min lr and max momentum.
    b2 is 0.99 throughout, as DeepSpeed's sets it (compcoll's optimizers read the groups' betas
    at every step). ``cycle_momentum=False`` leaves the betas alone. The same float operations as
    DeepSpeed's, so the same bits.
    """

    def __init__(self, optimizer: torch.optim.Optimizer, cycle_min_lr: float | Sequence[float],
                 cycle_max_lr: float | Sequence[float], decay_lr_rate: float = 0.0,
                 cycle_first_step_size: int = 2000, cycle_second_step_size: int | None = None,
                 cycle_first_stair_count: int = 0, cycle_second_stair_count: int | None = None,
                 decay_step_size: int = 0, cycle_momentum: bool = True, cycle_min_mom: float | Sequence[float] = 0.8,
                 cycle_max_mom: float | Sequence[float] = 0.9, decay_mom_rate: float = 0.0) -> None:
        self.first_step_size = float(cycle_first_step_size)
        self.second_step_size = self.first_step_size if cycle_second_step_size is None \
            else float(cycle_second_step_size)
        if self.first_step_size <= 0 or self.second_step_size < 0:
            raise ValueError(f"OneCycle: cycle_first_step_size must be positive and cycle_second_step_size "
                             f"non-negative, got {cycle_first_step_size!r} and {cycle_second_step_size!r}")
        self.total_size = self.first_step_size + self.second_step_size
        self.step_ratio = self.first_step_size / self.total_size
        self.stair_counts = (cycle_first_stair_count,
                             cycle_first_stair_count if cycle_second_stair_count is None else cycle_second_stair_count)
        self.decay_step_size = decay_step_size
        decays = not math.isclose(decay_step_size, 0)
        self.decay_lr_rate = decay_lr_rate if decays and not math.isclose(decay_lr_rate, 0) else None
        self.decay_mom_rate = decay_mom_rate if decays and not math.isclose(decay_mom_rate, 0) else None
        self.min_lrs = _per_group(optimizer, cycle_min_lr, "cycle_min_lr")
        self.max_lrs = _per_group(optimizer, cycle_max_lr, "cycle_max_lr")
        self.cycle_momentum = cycle_momentum and "betas" in optimizer.defaults
        if cycle_momentum and not self.cycle_momentum:
            warnings.warn(f"OneCycle: {type(optimizer).__name__} has no betas; the momentum is not cycled",
                          stacklevel=2)
        self.min_moms = _per_group(optimizer, cycle_min_mom, "cycle_min_mom")
        self.max_moms = _per_group(optimizer, cycle_max_mom, "cycle_max_mom")
        super().__init__(optimizer)

    def get_lr(self) -> list[float]:
        """The groups' learning rates at DeepSpeed's iteration ``last_epoch`` - 1; sets their betas too."""
        it = self.last_epoch - 1
        if it < 0:
            lrs, moms = list(self.min_lrs), list(self.min_moms)
        elif it < self.total_size:
            scale = self._scale(it + 1)
            lrs = [low + (high - low) * scale for low, high in zip(self.min_lrs, self.max_lrs)]
            moms = [high - (high - low) * scale for low, high in zip(self.min_moms, self.max_moms)]
        else:
            interval = (it - self.total_size + 1) / self.decay_step_size if self.decay_step_size else 0.0
            lrs = list(self.min_lrs) if self.decay_lr_rate is None \
                else [low / (1 + self.decay_lr_rate * interval) for low in self.min_lrs]
            moms = list(self.max_moms) if self.decay_mom_rate is None \
                else [high * (1 + self.decay_mom_rate * interval) for high in self.max_moms]
        if self.cycle_momentum:
            for group, momentum in zip(self.optimizer.param_groups, moms):
                group["betas"] = (momentum, 0.99)
        return lrs

    def _scale(self, batch: int) -> float:
        """Step 2's scale at DeepSpeed's batch index ``batch`` (= it + 1)."""
        cycle = math.floor(1 + batch / self.total_size)
        x = 1. + batch / self.total_size - cycle
        rising = x <= self.step_ratio
        scale = x / self.step_ratio if rising else (x - 1) / (self.step_ratio - 1)
        stairs = self.stair_counts[0 if rising else 1]
        if stairs > 0:
            into = batch % self.total_size
            position = (into * stairs / self.first_step_size if into <= self.first_step_size
                        else (self.total_size - into) * stairs / self.second_step_size)
            scale = math.floor(position) / stairs
        return scale


SCHEDULES: dict[str, type[LRScheduler]] = {"WarmupLR": WarmupLR, "WarmupDecayLR": WarmupDecayLR,
                                           "WarmupCosineLR": WarmupCosineLR, "OneCycle": OneCycle}
"""DeepSpeed's schedule names (as its configs spell them) carried over here."""
NOT_CARRIED = {"LRRangeTest": "a learning-rate search, not a training schedule: run it with DeepSpeed or "
                              "torch.optim.lr_scheduler.LambdaLR"}
"""DeepSpeed's other schedules, refused with the reason."""


def _per_group(optimizer: torch.optim.Optimizer, value: Any, name: str) -> list[float]:
    """One value per parameter group: ``value`` for every group, or a list or tuple of one per group."""
    if isinstance(value, (list, tuple)):
        if len(value) != len(optimizer.param_groups):
            raise ValueError(f"{name}: expected {len(optimizer.param_groups)} values (one per parameter group), "
                             f"got {len(value)}")
        return list(value)
    return [value] * len(optimizer.param_groups)


def _positive(name: str, value: int) -> int:
    """``value``, a positive integer, or ValueError naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
    return value


def _warmup_settings(warmup_num_steps: int, warmup_type: str) -> tuple[int, str, float]:
    """A warm-up's (steps: max(2, ``warmup_num_steps``), curve, 1 / log(steps)), as DeepSpeed sets them up: a curve
    other than "log" or "linear" warns and takes "log"."""
    steps = max(2, _positive("warmup_num_steps", warmup_num_steps))
    if warmup_type not in (LOG, LINEAR):
        warnings.warn(f"warmup_type {warmup_type!r} is neither 'log' nor 'linear'; taking 'log', as DeepSpeed does",
                      stacklevel=4)
        warmup_type = LOG
    return steps, warmup_type, 1.0 / math.log(steps)


def _warmup(curve: str, inverse_log: float, it: int, steps: int) -> float:
    """The warm-up's gamma at iteration ``it`` (below ``steps``): log(it + 1) / log(steps), or it / steps."""
    if curve == LOG:
        return inverse_log * math.log(it + 1)
    return it / steps


def _warn_short(total_num_steps: int, warmup_num_steps: int) -> None:
    if total_num_steps < warmup_num_steps:
        warnings.warn(f"total_num_steps {total_num_steps} is less than warmup_num_steps {warmup_num_steps}",
                      stacklevel=3)
