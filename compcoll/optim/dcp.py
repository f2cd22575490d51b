"""A ``torch.distributed.checkpoint`` load planner that resumes compcoll's optimizers and hook states on other ranks."""

from __future__ import annotations

import re
from typing import Any

import torch
from torch.distributed.checkpoint import DefaultLoadPlanner
from torch.distributed.checkpoint.metadata import Metadata, TensorStorageMetadata

from ..algorithms.parts import OWN_PART
from .saved import SECTION

__all__ = ["ElasticLoadPlanner"]

KeyPath = tuple[Any, ...]
"""Where a value sits in a nested state_dict: its keys (and list indices), outermost first."""


class ElasticLoadPlanner(DefaultLoadPlanner):
    """``dcp.load``'s default planner, plus compcoll's states saved by another number of ranks.

    A compcoll optimizer's ``state_dict()`` keeps what is rank r's own (its error feedback, Birder's
    local moments) under ``"rank{r}"`` of its first group's ``"compcoll"`` entry, so that
    ``dcp.save`` keeps every rank's. The hooks' states (``OneBitState``, FSDP's states,
    ``CompressedAllreduce``) keep theirs under ``"rank{r}"`` too, r the process's rank in the
    job, beside the job's size (``algorithms.parts.packed``). Loaded by as many ranks, each
    reads its own and the run continues bit for bit. Loaded by a world of another size, rank r
    asks for a ``"rank{r}"`` that a checkpoint of m <= r ranks lacks, or holds error buffers of
    another world's shapes, and ``DefaultLoadPlanner`` raises ("Missing key in checkpoint
    state_dict", "Size mismatch") on every rank. Before planning the reads, this planner:

    1. finds each compcoll section of the state_dict being loaded (a ``"param_groups"`` list
       whose first group holds ``SECTION``; a dict holding ``"job_size"`` and one process's
       part) and the ranks whose own parts the checkpoint holds under it;
    2. where those are the m ranks of a world other than the section's own (its
       ``"job_size"``, else its ``"world_size"``), renames this rank's own part
       ``"rank{r % m}"`` (the part ``compcoll.checkpoint.load`` takes on an elastic restart),
       each of its tensors shaped as that saved rank's (shapes and dtypes from the
       checkpoint's metadata; a hook state's part is one value);
    3. plans the reads as ``DefaultLoadPlanner`` does (its options pass through).

    The optimizer's ``load_state_dict`` (``set_state_dict``) then loads another world's state:
    the replicated part whole, the error buffers at zero and Birder's local moments rank
    ``r % m``'s, with a warning; a hook state's loads its counters and options, its error
    buffers at zero, with a warning. A checkpoint of the same world size loads exactly as
    without it.
    """

    def set_up_planner(self, state_dict: dict[str, Any], metadata: Metadata | None = None,
                       is_coordinator: bool = False) -> None:
        """Lay out each compcoll section's own part as the checkpoint holds it (steps 1-2), then plan (step 3)."""
        if metadata is not None:
            for path, section in _sections(state_dict, ()):
                _take_saved_part(section, path, metadata)
        super().set_up_planner(state_dict, metadata, is_coordinator)


def _sections(value: Any, path: KeyPath) -> list[tuple[KeyPath, dict[str, Any]]]:
    """(path, section) of every optimizer state in ``value`` (nested in dicts and lists) whose first parameter group
    holds ``SECTION``, and of every hook state's dict that holds one process's part (``parts.packed``)."""
    if isinstance(value, list):
        return [found for index, item in enumerate(value) for found in _sections(item, path + (index,))]
    if not isinstance(value, dict):
        return []
    groups = value.get("param_groups")
    if isinstance(groups, list) and groups and isinstance(groups[0], dict) and isinstance(groups[0].get(SECTION),
                                                                                          dict):
        return [(path + ("param_groups", 0, SECTION), groups[0][SECTION])]
    own = "job_size" in value and sum(bool(OWN_PART.fullmatch(str(key))) for key in value) == 1
    return [(path, value)] * own + [found for key, item in value.items() for found in _sections(item, path + (key,))]


def _take_saved_part(section: dict[str, Any], path: KeyPath, metadata: Metadata) -> None:
    """Replace this rank's ``"rank{r}"`` in ``section`` by rank ``r % m``'s of a checkpoint of m other ranks."""
    prefix = ".".join(map(str, path))
    pattern = re.compile(re.escape(prefix) + r"\.rank(\d+)(?:\.|$)")
    saved: dict[int, list[str]] = {}
    for fqn in metadata.state_dict_metadata:
        found = pattern.match(fqn)
        if found:
            saved.setdefault(int(found[1]), []).append(fqn)
    own = [key for key in section if OWN_PART.fullmatch(str(key))]
    world = section.get("job_size", section.get("world_size"))
    if len(own) != 1 or not saved or set(saved) != set(range(len(saved))) or len(saved) == world:
        return
    rank = int(own[0][4:])
    source = rank % len(saved)
    section[f"rank{source}"] = _part(section.pop(own[0]), saved[source], len(path) + 1, metadata)


def _part(own: Any, fqns: list[str], depth: int, metadata: Metadata) -> Any:
    """This rank's own part ``own`` laid out as one saved rank's (``fqns``, at the paths the checkpoint recorded below
    its first ``depth`` keys): a fresh tensor of each saved tensor's shape and dtype, on ``own``'s device."""
    paths = metadata.planner_data if isinstance(metadata.planner_data, dict) else {}
    device = next((t.device for t in _tensors(own)), torch.device("cpu"))
    part = _copy(own)
    for fqn in fqns:
        stored = metadata.state_dict_metadata[fqn]
        if not isinstance(stored, TensorStorageMetadata):
            continue
        leaf = torch.empty(stored.size, dtype=stored.properties.dtype, device=device)
        keys = tuple(paths.get(fqn, fqn.split(".")))[depth:]
        if not keys or not isinstance(part, dict):
            return leaf
        node = part
        for key in keys[:-1]:
            node = node.setdefault(key, {})
        node[keys[-1]] = leaf
    return part


def _copy(value: Any) -> Any:
    """``value`` with every dict in it copied (leaves shared)."""
    return {key: _copy(item) for key, item in value.items()} if isinstance(value, dict) else value


def _tensors(value: Any) -> list[torch.Tensor]:
    """Every tensor in a nested dict."""
    if isinstance(value, torch.Tensor):
        return [value]
    return [t for item in value.values() for t in _tensors(item)] if isinstance(value, dict) else []
