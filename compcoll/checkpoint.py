"""Per-process checkpoints: every rank saves and loads its own share of optimizers' and hooks' state, all or none."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any, Protocol

import torch

from .algorithms.rounds import agree_outcome
from .comm import Communicator, get_default


class Stateful(Protocol):
    """What ``save`` and ``load`` take: compcoll's optimizers, ``OneBitState``, ``BirderState``,
    ``CompressedAllreduce``."""

    def state_dict(self) -> dict[str, Any]:
        """This rank's state, as tensors and plain values (``torch.load(weights_only=True)`` reads it back)."""

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what ``state_dict()`` returned."""


def path_of(directory: str | os.PathLike, rank: int, world_size: int) -> Path:
    """The file that holds process ``rank``'s share of a checkpoint taken by a job of ``world_size`` processes."""
    return Path(directory) / f"compcoll-rank{rank}-of-{world_size}.pt"


def save(directory: str | os.PathLike, *states: Stateful, comm: Communicator | None = None) -> Path:
    """Save this rank's state of every object in ``states`` (in order); every rank calls it.

    1. Write ``[s.state_dict() for s in states]`` to this process's file in ``directory``
       (``path_of`` its rank in the whole job, ``comm.job_rank`` of ``comm.job_size``: the
       ranks of a subgroup, such as HSDP's replica groups, repeat in every group), through a
       temporary file renamed into place, so a crash leaves the previous checkpoint whole.
    2. Agree on the outcome (``agree_outcome``): if any rank could not save, every rank
       raises, the failing ones their own error, the others ``RemoteError`` naming them.

    Args:
        directory: created if missing; shared by all ranks or each rank's own.
        states: objects with ``state_dict()`` / ``load_state_dict()``.
        comm: the ranks that save together; None: the first state's ``comm`` (an
            optimizer's, a hook state's own group), else ``compcoll.get_default()``.

    Returns:
        This process's file.
    """
    comm = _communicator(states, comm)
    path = path_of(directory, comm.job_rank, comm.job_size)
    error = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_suffix(".partial")
        torch.save([state.state_dict() for state in states], partial)
        os.replace(partial, path)
    except Exception as exc:  # any rank's failure must reach every rank, whatever it is
        error = exc
    agree_outcome(comm, "compcoll.checkpoint.save", error)
    return path


def load(directory: str | os.PathLike, *states: Stateful, comm: Communicator | None = None) -> None:
    """Load this rank's share of a checkpoint that ``save`` wrote into ``states`` (same objects, same order).

    1. Find this process's file (``saved_file``, by its rank in the job as ``save`` names it):
       its own, from a job of the same size; or, where the directory holds only the complete
       files of a job of another size m (an elastic restart), the file of process
       ``rank % m`` of that job.
    2. Read it and check it holds one state per object. Agree on the outcome: if any
       rank's file is missing or unreadable (``ValueError`` naming it), every rank raises
       before any object changes.
    3. ``load_state_dict`` each object (each checks its own layout, and from another
       process's file loads the replicated part, warns, and restarts what was that rank's
       own: error feedback at zero), then agree again: a rank whose objects refused their
       state makes every rank raise (reload before training on).

    Args:
        directory: as for ``save``.
        states: as for ``save``.
        comm: as for ``save``.
    """
    comm = _communicator(states, comm)
    saved: list[dict[str, Any]] = []
    error = None
    try:
        path = saved_file(directory, comm.job_rank, comm.job_size)
        saved = _read(path)
        if len(saved) != len(states):
            raise ValueError(f"{path} holds {len(saved)} states, {len(states)} objects were given to load")
    except Exception as exc:
        error = exc
    agree_outcome(comm, "compcoll.checkpoint.load", error)
    try:
        for state, values in zip(states, saved):
            state.load_state_dict(values)
    except Exception as exc:
        error = exc
    agree_outcome(comm, "compcoll.checkpoint.load", error)


def _read(path: Path) -> list[dict[str, Any]]:
    """The states in ``path``, or ValueError naming the file first (a peer's message carries only its start) and
    then torch's error: a file ``save`` did not write, or one cut short or damaged."""
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:
        raise ValueError(f"{path} is not a whole checkpoint file of compcoll.checkpoint.save (torch.load: "
                         f"{type(exc).__name__}: {''.join(str(exc).splitlines()[:1])[:200]})") from exc


def saved_file(directory: str | os.PathLike, rank: int, world_size: int) -> Path:
    """The file process ``rank`` of a job of ``world_size`` loads from ``directory``.

    1. Its own (``path_of``), where it exists.
    2. Otherwise, where no file of this job size is there and the files of exactly one
       other job size m are, all m of them: process ``rank % m``'s of that job (every
       state in it holds the replicated part every rank had: moments, counters, options).
    3. Otherwise ``FileNotFoundError`` naming the files found.
    """
    own = path_of(directory, rank, world_size)
    if own.exists():
        return own
    names = sorted(p.name for p in Path(directory).glob("compcoll-rank*-of-*.pt"))
    worlds: dict[int, set[int]] = {}
    for found in filter(None, map(_RANK_FILE.fullmatch, names)):
        worlds.setdefault(int(found[2]), set()).add(int(found[1]))
    complete = [m for m, ranks in worlds.items() if ranks == set(range(m))]
    if world_size not in worlds and len(complete) == 1 and len(worlds) == 1:
        return path_of(directory, rank % complete[0], complete[0])
    raise FileNotFoundError(
        f"no checkpoint file {own.name} in {directory} (found: {', '.join(names) or 'none'}): resume with the world "
        f"size that saved it, or from a directory that holds every file of one other world size (then error "
        f"feedback restarts at zero)")


_RANK_FILE = re.compile(r"compcoll-rank(\d+)-of-(\d+)\.pt")
"""The name ``path_of`` gives a rank's file: its rank and world size."""


def _communicator(states: tuple[Stateful, ...], comm: Communicator | None) -> Communicator:
    """``comm``, else the first state's ``comm`` attribute that is a Communicator, else the default one."""
    if comm is not None:
        return comm
    for state in states:
        found = getattr(state, "comm", None)
        if isinstance(found, Communicator):
            return found
    return get_default()
