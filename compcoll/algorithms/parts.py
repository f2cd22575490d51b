"""A state's own part (one process's error buffers) under that process's key, so every process's checkpoint keeps it."""

from __future__ import annotations

import io
import re
from typing import Any

import torch

OWN_PART = re.compile(r"rank(\d+)")
"""The key of a process's own part in a ``packed`` state: ``rank{r}``, r its rank in the job."""


def packed(state: dict[str, Any], own: tuple[str, ...]) -> dict[str, Any]:
    """``state`` (whose ``"job"`` is [this process's rank in the job, the job's size]) with the entries ``own`` packed
    into one value under ``"rank{r}"``.

    1. ``torch.distributed.checkpoint`` keeps one copy of what every process saves under one
       key, so what is one process's own (its error buffers, its rank in its group) goes under
       a key no other process writes: its rank in the job. Every other entry is alike on every
       process; ``"job"`` becomes ``"job_size"``, the key holds the rank.
    2. The part goes as one value, the bytes ``torch.save`` writes of it: ``dcp.load`` fills
       only the keys of a fresh state's ``state_dict()``, and a fresh state, which holds no
       error buffers yet, can name this one key where it could not name tensors it lacks.
    """
    rank, size = state["job"]
    buffer = io.BytesIO()
    torch.save({key: state[key] for key in own}, buffer)
    shared = {key: value for key, value in state.items() if key not in own and key != "job"}
    return {**shared, "job_size": size, f"rank{rank}": buffer.getvalue()}


def unpacked(state: dict[str, Any]) -> dict[str, Any]:
    """``state`` with its own part (``packed``) unpacked among its entries and ``"job"`` restored, its tensors on the
    CPU (as ``compcoll.checkpoint`` loads files; they follow the calls' tensors to their device); a state of the layout
    before 2026-12-01 (nothing packed) as it is.

    Raises:
        ValueError: the state holds more than one process's own part.
    """
    keys = [key for key in state if OWN_PART.fullmatch(str(key))]
    if not keys:
        return state
    if len(keys) > 1:
        raise ValueError(f"this state holds the own parts of {len(keys)} processes ({', '.join(map(str, keys))}), "
                         f"where a process saves one: load the state_dict() of one process")
    part = torch.load(io.BytesIO(state[keys[0]]), map_location="cpu", weights_only=True)
    shared = {key: value for key, value in state.items() if key not in (keys[0], "job_size")}
    return {**shared, **part, "job": [int(OWN_PART.fullmatch(keys[0])[1]), state["job_size"]]}
