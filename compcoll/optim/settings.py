"""The optimizers' settings: their checks, and the settings and groups' hyperparameters every rank holds alike.

The checks cover hyperparameters, what they compress and the phases' lengths; every rank must hold an optimizer's
settings and its groups' hyperparameters alike (``differences.values_option`` names the one that differs).
"""

from __future__ import annotations

import numbers
from typing import Any

import torch

from ..algorithms.agreement import Option
from ..algorithms.differences import values_option
from ..algorithms.inputs import check_protocol, check_scale
from ..comm.topology import requested_ranks_per_node
from ..spec import CHANNEL_PROTOCOLS

NONFINITE_POLICIES = ("skip", "raise")
COMPRESSED = ("update", "momentum")
"""What the Adam-family optimizers send in 1 bit: the preconditioned momentum m / (sqrt(v) + eps), or m itself
(DeepSpeed's choice); docs/architecture.md, "Algorithms"."""


def compression_settings(what: str, compress: str, scale: str, protocol: str = "auto") -> dict[str, Any]:
    """Check ``compress`` (one of ``COMPRESSED``), ``scale`` (``spec.SCALES``) and ``protocol``
    (``spec.CHANNEL_PROTOCOLS``); the settings of them that all ranks must hold alike."""
    if not isinstance(compress, str) or compress not in COMPRESSED:
        raise ValueError(f"{what}: compress {compress!r} is not one of {COMPRESSED} (update: m / (sqrt(v) + eps); "
                         f"momentum: m, as DeepSpeed)")
    check_scale(what, scale)
    check_protocol(what, protocol, CHANNEL_PROTOCOLS)
    return {"compress": compress, "scale": scale, "protocol": protocol}


def bias_correction_setting(what: str, bias_correction: bool) -> dict[str, Any]:
    """Check ``bias_correction`` (True or False); the setting all ranks must hold alike."""
    if not isinstance(bias_correction, bool):
        raise ValueError(f"{what}: bias_correction must be True or False, got {bias_correction!r}")
    return {"bias_correction": bias_correction}


def layout_settings(what: str, ranks_per_node: int | str | None, hierarchical: bool | None = None) -> dict[str, Any]:
    """Check ``ranks_per_node`` (a positive integer, "auto" or None, and ``COMPCOLL_RANKS_PER_NODE`` where it is
    read) and ``hierarchical`` (None, True or False); the settings of them all ranks must hold alike."""
    try:
        requested_ranks_per_node(ranks_per_node)
    except ValueError as exc:
        raise ValueError(f"{what}: {exc}") from None
    if not isinstance(hierarchical, (bool, type(None))):
        raise ValueError(f"{what}: hierarchical must be None (by the nodes), True or False, got {hierarchical!r}")
    return {"ranks_per_node": ranks_per_node, "hierarchical": hierarchical}


def is_number(value: Any) -> bool:
    """Whether ``value`` is a real number (Python's or numpy's, not a bool)."""
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def _scalar(value: Any) -> bool:
    """Whether ``value`` is a number or a one-element tensor (torch's optimizers take a tensor ``lr``)."""
    return is_number(value) or isinstance(value, torch.Tensor) and value.numel() == 1


SETTINGS = "settings"
"""What an optimizer's own settings (its arguments besides the groups' hyperparameters) are called in messages."""
HYPERPARAMETERS = "hyperparameters of the parameter groups"
"""What ``hyperparameters`` covers, for messages."""


def hyperparameters(param_groups: list[dict[str, Any]]) -> Option:
    """Every group's hyperparameters that are plain data (``_plain``), named ``"lr of group 0"`` and so on, as the
    option every rank must hold alike when it builds an optimizer and at every step (``differences.values_option``:
    its code a CRC-32 of them, and a mismatch named by hyperparameter, group and ranks)."""
    return values_option(HYPERPARAMETERS, {f"{key} of group {index}": plain
                                           for index, group in enumerate(param_groups)
                                           for key, value in group.items()
                                           if key != "params" and (plain := _plain(value)) is not None})


def _plain(value: Any) -> Any:
    """A group hyperparameter as plain data every rank writes alike (numbers, strings, their tuples and lists, a
    small tensor's values), or None for what is not (an object whose repr holds its address)."""
    if isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (tuple, list)):
        items = [_plain(v) for v in value]
        return None if any(item is None for item in items) else tuple(items)
    if isinstance(value, torch.Tensor) and value.numel() <= 16:
        return tuple(value.detach().cpu().reshape(-1).tolist())
    return None


def variance_frozen(setting: str, step: int, why: str = "") -> str:
    """Why an optimizer whose variance freezes at ``step`` (its ``setting``) takes no new parameters now
    (``CompressedOptimizer._growth_refused``): ``why`` (default: it froze already)."""
    why = why or f"its variance froze at step {step} ({setting})"
    return (f"{why}, and its 1-bit steps leave a coordinate without variance where it is, so new parameters would "
            f"never train; add groups earlier, or build a new optimizer with every group (its warm-up runs again)")


def warmup_steps(what: str, name: str, value: int | float, total_steps: int | None, least: int = 0) -> int:
    """A phase length in steps: ``value`` itself, or, a float in (0, 1), that fraction of ``total_steps``.

    1. A float strictly between 0 and 1 is a share of the run (the papers warm up for
       10-25% of it): round(value * total_steps), which needs ``total_steps``, the run's
       optimizer steps (the Trainer's ``max_steps``).
    2. Anything else is a count of steps.
    3. ValueError naming ``name`` when the count is below ``least`` or not a whole number,
       or a share comes without a positive ``total_steps``.
    """
    if not is_number(value):
        raise ValueError(f"{what}: {name} must be a number of steps or a share of the run in (0, 1), got {value!r}")
    if isinstance(value, float) and 0.0 < value < 1.0:
        if isinstance(total_steps, bool) or not isinstance(total_steps, int) or total_steps < 1:
            raise ValueError(f"{what}: {name}={value} is a share of the run, so pass total_steps, the run's number "
                             f"of optimizer steps (got {total_steps!r})")
        steps = round(value * total_steps)
    elif not float(value).is_integer():
        raise ValueError(f"{what}: {name} must be a number of steps or a share of the run in (0, 1), got {value!r}")
    else:
        steps = int(value)
    if steps < least:
        raise ValueError(f"{what}: {name} must come to at least {least} step(s), got {value!r}"
                         + (f" of {total_steps} steps" if isinstance(value, float) and value < 1.0 else ""))
    return steps


def check_hyperparameters(
    what: str, lr: float, betas: tuple[float, float], eps: float | None, weight_decay: float
) -> None:
    """ValueError naming the first bad hyperparameter (eps, if the algorithm has one, must be > 0: v = 0 divides by
    it)."""
    if not _scalar(lr) or not lr >= 0.0:
        raise ValueError(f"{what}: lr must be a number >= 0, got {lr!r}")
    if not isinstance(betas, (tuple, list)) or len(betas) != 2 or not all(_scalar(b) and 0.0 <= b < 1.0
                                                                          for b in betas):
        raise ValueError(f"{what}: betas must be two numbers in [0, 1), got {betas!r}")
    if eps is not None and (not _scalar(eps) or not eps > 0.0):
        raise ValueError(f"{what}: eps must be a number > 0, got {eps!r}")
    if not _scalar(weight_decay) or not weight_decay >= 0.0:
        raise ValueError(f"{what}: weight_decay must be a number >= 0, got {weight_decay!r}")
