"""Another optimizer's per-parameter state (torch's Adam, DeepSpeed's 1-bit optimizers) carried into compcoll's."""

from __future__ import annotations

import logging
from typing import Any

import torch

from .base import CompressedOptimizer
from .onebit_lamb import OneBitLamb
from .saved import SECTION

log = logging.getLogger(__name__)

ADAM_MOMENTS = ("exp_avg", "exp_avg_sq")
"""torch's Adam's per-parameter moments, as 1-bit Adam names its buffers (``CompressedOptimizer._carried``)."""
LAYER_SCALARS = {"lamb_coeff_freeze": "coeff_freeze", "last_factor": "last_factor", "scaling_coeff": "scaling_coeff"}
"""1-bit LAMB's per-parameter floats in DeepSpeed's state, and the attribute of compcoll's per-layer float64 buffer
that holds each (its ``state_dict`` key is DeepSpeed's name)."""


def carry(optimizer: CompressedOptimizer, state: dict[Any, dict[str, Any]], groups: list[dict[str, Any]],
          source: str) -> None:
    """Copy a torch-layout optimizer state (``state`` per parameter key, ``groups`` listing the keys) into
    ``optimizer``, a ``OneBitAdam``, ``OneBitLamb`` or ``ZeroOneAdam`` (its ``_carried`` moments) over the same
    parameters in the same groups.

    1. Check that the groups, parameter count and every trained shape match the optimizer's
       and that every trained parameter with state is at one step, and for 0/1 Adam at one
       point of its schedule (``_carried_schedule``) (ValueError naming the first that
       differs, ``source`` first; nothing changes). A parameter the optimizer keeps frozen
       needs no state; nor, into a ``OneBitAdam`` or ``ZeroOneAdam``, one the other optimizer
       never stepped (torch's Adam keeps no state for a parameter that had no gradient yet):
       its moments start at zero, as they would have there.
    2. Copy each trained parameter's moments (``_carried``) into the flat buffers and, for
       1-bit LAMB, its floats (``LAYER_SCALARS``) into the per-layer buffers; set the step
       count, so the phase follows from ``freeze_step`` (``var_freeze_step``), and 0/1 Adam's
       intervals and counters, so its refreshes and synchronisations keep their schedule.
       The error buffers restart at zero, and so do 0/1 Adam's local steps since its last
       synchronisation (DeepSpeed's accumulated momentum: its own load drops it too, and the
       model's weights hold the saving rank's steps), with a warning where there were some.
    The hyperparameters stay the optimizer's own.
    """
    moments = optimizer._carried
    optimizer._follow_parameters()
    flat = optimizer.flat
    sizes = [len(group["params"]) for group in optimizer.param_groups]
    if [len(group["params"]) for group in groups] != sizes:
        raise ValueError(f"{source}: parameter groups of {[len(g['params']) for g in groups]} parameters, the "
                         f"optimizer's have {sizes}")
    order = [key for group in groups for key in group["params"]]
    order = [order[i] for i in flat.trained]
    lamb = isinstance(optimizer, OneBitLamb)
    copies = []
    for key, shape, segment in zip(order, flat.shapes, flat.segments):
        entry = state.get(key)
        if entry is None and not lamb:
            copies += [(getattr(optimizer, name)[segment.start:segment.stop], None) for name in moments]
            continue
        entry = entry or {}
        for name in moments:
            saved = entry.get(name)
            if saved is None or tuple(saved.shape) != shape:
                found = "none" if saved is None else tuple(saved.shape)
                raise ValueError(f"{source}: parameter {key}'s {name} is {found}, expected shape {shape}")
            copies.append((getattr(optimizer, name)[segment.start:segment.stop], saved))
    stepped = [state[key] for key in order if key in state]
    steps = {int(entry["step"]) for entry in stepped}
    if len(steps) != 1:
        raise ValueError(f"{source}: parameters at different steps {sorted(steps)}" if steps else
                         f"{source}: no trained parameter has state (a run that never stepped?)")
    layers = _layer_scalars(stepped, source) if lamb else {}
    schedule = _schedule(stepped, optimizer._carried_schedule, source)
    for target, saved in copies:
        if saved is None:
            target.zero_()
        else:
            target.copy_(saved.reshape(-1))
    for name, values in layers.items():
        if name == "scaling_coeff":
            optimizer.scaled = values is not None
        if values is not None:
            getattr(optimizer, LAYER_SCALARS[name]).copy_(torch.tensor(values, dtype=torch.float64))
    optimizer.steps = steps.pop()
    for name, value in schedule.items():
        setattr(optimizer, name, value)
    if any(float(entry.get("lrs", 0.0)) for entry in stepped):
        log.warning("%s: the local steps since 0/1 Adam's last synchronisation are not carried (the model's "
                    "weights hold the saving rank's), as DeepSpeed's own load drops them", source)
    optimizer._drop_local_steps()
    optimizer.channel.reset()
    if hasattr(optimizer, "var_freeze_step"):
        phase = "local" if optimizer.steps >= optimizer.var_freeze_step else "variance"
    else:
        phase = "compression" if optimizer.steps >= optimizer.freeze_step else "warmup"
    log.info("%s: %s at step %d (%s phase); error buffers restart at zero", source, type(optimizer).__name__,
             optimizer.steps, phase)


def _layer_scalars(entries: list[dict[str, Any]], source: str) -> dict[str, list[float] | None]:
    """1-bit LAMB's per-parameter floats of the trained parameters' ``entries``: ``LAYER_SCALARS``, and
    ``scaling_coeff`` (None where no parameter has one yet: the compression has not started; ValueError where some
    have and some not)."""
    found: dict[str, list[float] | None] = {}
    for key in ("lamb_coeff_freeze", "last_factor"):
        found[key] = [float(value) for value in _each(entries, key, source, "OneBitLamb")]
    scaled = ["scaling_coeff" in entry for entry in entries]
    if any(scaled) and not all(scaled):
        raise ValueError(f"{source}: scaling_coeff for some parameters and not others")
    found["scaling_coeff"] = [float(entry["scaling_coeff"]) for entry in entries] if all(scaled) else None
    return found


def _schedule(entries: list[dict[str, Any]], names: dict[str, str], source: str) -> dict[str, int]:
    """The schedule counters ``names`` (DeepSpeed's key -> the optimizer's scalar) of the trained parameters'
    ``entries``, which must all hold each, alike (ValueError naming the first that does not)."""
    found = {}
    for key, name in names.items():
        values = set(map(int, _each(entries, key, source, "ZeroOneAdam")))
        if len(values) != 1:
            raise ValueError(f"{source}: parameters at different {key} {sorted(values)}")
        found[name] = values.pop()
    return found


def _each(entries: list[dict[str, Any]], key: str, source: str, owner: str) -> list[Any]:
    """Every entry's ``key``; ValueError naming the first trained parameter without it (``owner``'s state holds it)."""
    missing = [i for i, entry in enumerate(entries) if key not in entry]
    if missing:
        raise ValueError(f"{source}: no {key} for trained parameter {missing[0]} (a {owner}'s?)")
    return [entry[key] for entry in entries]


def is_torch_adam_state(state_dict: dict[str, Any]) -> bool:
    """Whether ``state_dict`` is a torch Adam's (or AdamW's): per-parameter ``exp_avg`` and ``exp_avg_sq``, none of
    compcoll's entries."""
    groups, state = state_dict.get("param_groups") or [{}], state_dict.get("state")
    return (isinstance(state, dict) and bool(state) and SECTION not in groups[0] and "algorithm" not in state
            and all(isinstance(entry, dict) and set(ADAM_MOMENTS) <= set(entry) for entry in state.values()))


def load_torch_adam_state(optimizer: CompressedOptimizer, state_dict: dict[str, Any]) -> None:
    """Carry ``torch.optim.Adam``'s or ``AdamW``'s ``state_dict()`` into a ``OneBitAdam`` over the same parameters in
    the same groups: a run switches to 1-bit Adam keeping Adam's moments and step.

    1. Refuse another optimizer than ``OneBitAdam``, and AMSGrad's state (``max_exp_avg_sq``:
       1-bit Adam keeps no maximum), with the reason (ValueError; nothing changes).
    2. ``carry`` the moments and the step: with ``freeze_step`` at or below that step the next
       step compresses, v frozen at Adam's; below, the warm-up goes on from Adam's moments.
    The hyperparameters stay the optimizer's own: ``OneBitAdam(bias_correction=True)`` steps as
    AdamW does at the same lr, betas, eps and weight_decay (its weight decay is decoupled;
    torch's Adam adds its own to the gradient).
    """
    source = "torch Adam state"
    if optimizer._carried != ADAM_MOMENTS or optimizer._carried_schedule:
        raise ValueError(f"{source}: carries into a OneBitAdam, got a {type(optimizer).__name__} (its state holds "
                         f"more than Adam's moments)")
    state, groups = state_dict.get("state"), state_dict.get("param_groups")
    if not isinstance(state, dict) or not isinstance(groups, list):
        raise ValueError(f"{source}: expected an optimizer's state_dict() (\"state\" and \"param_groups\")")
    if any("max_exp_avg_sq" in entry for entry in state.values()):
        raise ValueError(f"{source}: AMSGrad's (max_exp_avg_sq); 1-bit Adam keeps no maximum of v")
    carry(optimizer, state, groups, source)


def torch_adam_state(optimizer: CompressedOptimizer) -> dict[str, Any]:
    """A ``OneBitAdam``'s moments and step as ``torch.optim.AdamW``'s ``state_dict()``: a run goes back to AdamW
    (to tell whether the compression is what changed it) with ``adamw.load_state_dict(torch_adam_state(opt))``.

    1. Refuse another optimizer than ``OneBitAdam`` (ValueError with the reason).
    2. Per trained parameter, by its index in the groups: ``step`` (a float32 tensor, as
       torch keeps it), and copies of its ``exp_avg`` and ``exp_avg_sq`` in its shape; the
       groups' lr, betas, eps and weight_decay (AdamW's weight decay is decoupled, as
       ``OneBitAdam``'s is). Frozen parameters have no state, as in torch's.
    The error buffers stay behind: what the compression had not sent yet is dropped.
    """
    if optimizer._carried != ADAM_MOMENTS or optimizer._carried_schedule:
        raise ValueError(f"torch_adam_state: takes a OneBitAdam, got a {type(optimizer).__name__} (its state holds "
                         f"more than Adam's moments)")
    optimizer._follow_parameters()
    flat = optimizer.flat
    state = {index: {"step": torch.tensor(float(optimizer.steps)),
                     **{name: optimizer.state[p][name].clone() for name in ADAM_MOMENTS}}
             for index, p in zip(flat.trained, flat.trained_params)}
    groups, start = [], 0
    for group in optimizer.param_groups:
        groups.append({**{key: group[key] for key in ("lr", "betas", "eps", "weight_decay")},
                       "params": list(range(start, start + len(group["params"])))})
        start += len(group["params"])
    return {"state": state, "param_groups": groups}
