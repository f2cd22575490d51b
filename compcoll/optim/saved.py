"""An optimizer's saved state in torch's layout: per-parameter state, compcoll's own under the first group."""

from __future__ import annotations

from typing import Any

import torch

from .flat import FlatParams

SECTION = "compcoll"
"""The key of the first parameter group that holds what is not one parameter's (counters, error feedback)."""


def per_parameter(buffers: dict[str, torch.Tensor], flat: FlatParams, rank_own: tuple[str, ...]) -> list[str]:
    """The buffers kept per parameter: those of one value per flat element that every rank holds alike."""
    return [name for name, buf in buffers.items() if buf.numel() == flat.numel and name not in rank_own]


def parameter_views(buffers: dict[str, torch.Tensor], flat: FlatParams, rank_own: tuple[str, ...]
                    ) -> list[tuple[torch.Tensor, dict[str, torch.Tensor]]]:
    """(trained parameter, {name: its view of each ``per_parameter`` buffer, in its shape}), in order."""
    names = per_parameter(buffers, flat, rank_own)
    return [(p, {name: buffers[name][seg.start:seg.stop].view(shape) for name in names})
            for p, seg, shape in zip(flat.trained_params, flat.segments, flat.shapes)]


def torch_layout(inner: dict[str, Any], groups: list[dict[str, Any]], flat: FlatParams, rank_own: tuple[str, ...],
                 synchronized: bool) -> dict[str, Any]:
    """``inner`` (the optimizer's whole state, its buffers flat) as torch's optimizers lay out a ``state_dict``.

    1. ``"state"``: for each trained parameter, by its index in the groups, a copy of its
       part of every ``per_parameter`` buffer, in its shape (torch's ``exp_avg`` and the like),
       so ``torch.distributed.checkpoint``'s ``get_state_dict`` names it by the
       parameter's name.
    2. ``"param_groups"``: the groups' hyperparameters and parameter indices; the first group
       also holds ``SECTION``: the counters, phase scalars, the other buffers whole, the
       float32 masters of 16-bit parameters while the replicas agree, and under
       ``"rank{r}"`` what is this rank's own (its error feedback, its ``rank_own`` buffers,
       its parameters while the replicas differ), so that a checkpoint of every rank's
       state dedupes what ranks share and keeps each rank's own apart.
    """
    names = per_parameter(inner["buffers"], flat, rank_own)
    state = {index: {name: view.clone() for name, view in views.items()}
             for index, (_, views) in zip(flat.trained, parameter_views(inner["buffers"], flat, rank_own))}
    own = {"error_feedback": inner["error_feedback"],
           "buffers": {name: inner["buffers"][name].clone() for name in rank_own}}
    section = {key: inner[key] for key in ("algorithm", "world_size", "layout", "steps", "skipped_steps", "scalars")}
    section["buffers"] = {name: buf.clone() for name, buf in inner["buffers"].items()
                          if name not in names and name not in rank_own}
    if inner["params"] is not None:
        (section if synchronized else own)["params"] = inner["params"]
    section[f"rank{inner['rank']}"] = own
    groups = [dict(group) for group in groups]
    groups[0][SECTION] = section
    return {"state": state, "param_groups": groups}


def inner_state(state_dict: dict[str, Any], flat: FlatParams, rank: int, size: int, what: str) -> dict[str, Any]:
    """The optimizer's whole state from a ``state_dict`` in ``torch_layout``'s layout, or in the layout of before
    2026-11-30 (the whole state under ``"state"``); ValueError when it is neither.

    1. Put every trained parameter's per-parameter state back into flat buffers (when the
       state is of this parameter layout). Entries are keyed as the groups' ``"params"``
       lists name the parameters, taken by position as torch's optimizers take them: indices
       here, names where ``torch.distributed.checkpoint``'s ``set_state_dict`` loads it.
    2. Take this rank's own part (``"rank{rank}"``) when the state is of a world of ``size``
       ranks and holds it, or else the lowest rank's (a framework that saved rank 0's state
       for every rank); ``"rank"`` says whose it is.
    """
    groups = state_dict.get("param_groups") or [{}]
    section = groups[0].get(SECTION)
    if section is None:
        state = state_dict.get("state", {})
        if "algorithm" in state:
            return state
        raise ValueError(f"{what}: this state_dict holds no {SECTION!r} entry in its first parameter group: a torch "
                         f"optimizer's state does not load into it, nor one that torch.distributed.checkpoint's "
                         f"set_state_dict flattened (StateDictOptions(flatten_optimizer_state_dict=True) keeps only "
                         f"the groups' torch keys: save and load without it)")
    buffers = dict(section["buffers"])
    position = {key: i for i, key in enumerate(key for group in groups for key in group.get("params", ()))}
    entries = {position.get(key, key): entry for key, entry in state_dict["state"].items()}
    if section["layout"] == flat.layout_code():  # otherwise the optimizer names the other layout
        for name in sorted({name for entry in entries.values() for name in entry}):
            buffers[name] = _flat(name, entries, flat, what)
    ranks = sorted(int(key[4:]) for key in section if key.startswith("rank") and key[4:].isdigit())
    if not ranks:
        raise ValueError(f"{what}: this state_dict holds no rank's own part (\"rank<r>\" under {SECTION!r})")
    chosen = rank if rank in ranks and section["world_size"] == size else ranks[0]
    own = section[f"rank{chosen}"]
    buffers.update(own["buffers"])
    inner = {key: section[key] for key in ("algorithm", "world_size", "layout", "steps", "skipped_steps", "scalars")}
    inner.update(rank=chosen, buffers=buffers, error_feedback=own["error_feedback"],
                 params=own.get("params", section.get("params")))
    return inner


def _flat(name: str, entries: dict[int, dict[str, torch.Tensor]], flat: FlatParams, what: str) -> torch.Tensor:
    """Buffer ``name`` as one flat vector from every trained parameter's entry; ValueError naming a missing or
    misshapen one."""
    parts = []
    for index, shape in zip(flat.trained, flat.shapes):
        part = entries.get(index, {}).get(name)
        if part is None or tuple(part.shape) != shape:
            got = "none" if part is None else f"shape {tuple(part.shape)}"
            raise ValueError(f"{what}: checkpoint state {name!r} of parameter {index} should have shape {shape}, "
                             f"got {got}")
        parts.append(part.reshape(-1))
    return torch.cat(parts)
