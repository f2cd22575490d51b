"""Plans: one collective on one layout, owning its agreement, scratch buffers and error-feedback state."""

from __future__ import annotations

import threading
import warnings
from abc import ABC, abstractmethod
from collections import OrderedDict
from typing import Any, Callable, Hashable

import torch

from ..comm import Communicator
from ..comm.work import Work
from ..spec import padded_numel
from ..workspace import Workspace
from .agreement import Agreement, Option, Step, kept
from .launch import launch
from .replay import Replays

MAX_CACHED_PLANS = 64
"""Plans kept per communicator for the functional calls (least recently used dropped first)."""


def check_owner(state: dict[str, Any], rank: int, world_size: int) -> None:
    """Refuse an error-feedback checkpoint saved by another rank or in a world of another size."""
    if state["world_size"] != world_size or state["rank"] != rank:
        raise ValueError(
            f"error-feedback checkpoint is from rank {state['rank']} of {state['world_size']}, "
            f"this is rank {rank} of {world_size}: server errors belong to per-rank "
            f"chunks, so resume with the same world size and each rank's own state"
        )


def owned(state: dict[str, Any], comm: Communicator, what: str) -> bool:
    """Whether a checkpoint holding error feedback is this rank's own: saved by rank ``comm.rank`` of a group of
    ``comm.size`` (``state["rank"]``, ``state["world_size"]``) and, where the state says (``state["job"]``, saved
    since 2026-12-01), by process ``comm.job_rank`` of a job of ``comm.job_size``: every HSDP replica group has a
    rank 0, each of another shard. Where it is not, warn that ``what``'s error buffers restart at zero
    (``foreign_state``)."""
    job = [comm.job_rank, comm.job_size]
    if (state["world_size"], state["rank"], list(state.get("job", job))) == (comm.size, comm.rank, job):
        return True
    warnings.warn(foreign_state(what, state, comm.rank, comm.size, "its error buffers restart at zero", job),
                  stacklevel=3)
    return False


def foreign_state(what: str, state: dict[str, Any], rank: int, world_size: int, lost: str,
                  job: list[int] | None = None) -> str:
    """The warning of a state loaded from another rank or world size (or, given this process's ``job`` = [rank, size]
    where the state holds its own, another process of the job): what resumes, what is ``lost`` (one rank's own), and
    how to resume exactly."""
    saved, here = f"rank {state['rank']} of {state['world_size']}", f"rank {rank} of {world_size}"
    saved_job = list(state.get("job", job or [])) or None
    if saved == here and job is not None and saved_job != job:
        saved += f" (process {saved_job[0]} of {saved_job[1]})"
        here += f" (process {job[0]} of {job[1]})"
    resized = state["world_size"] != world_size or (job is not None and saved_job[1] != job[1])
    how = ("an exact resume needs the world size that saved it" if resized else
           "for an exact resume save and load every rank's state with compcoll.checkpoint.save / load")
    return f"{what}: loaded the state of {saved} on {here}: counters resume exactly, but {lost} (one rank's own); {how}"


class ErrorFeedback:
    """The worker and server error buffers of one rank for one plan, and which coordinates each covers.

    The worker buffer holds ``worker_numel`` elements of the padded vector from
    ``worker_start``, the server buffer ``server_numel`` from ``server_start`` (flat
    gather-scatter: the whole vector and this rank's chunk; hierarchical: this rank's
    shard and its sub-chunk). They start at zero.
    """

    def __init__(
        self, rank: int, world_size: int, numel: int, worker: tuple[int, int], server: tuple[int, int],
        device: torch.device,
    ) -> None:
        self.rank = rank
        self.world_size = world_size
        self.numel = numel
        self.worker_error = torch.zeros(worker[0], dtype=torch.float32, device=device)
        self.server_error = torch.zeros(server[0], dtype=torch.float32, device=device)
        self._starts = (worker[1], server[1])

    def buffers(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(worker_error, server_error), updated in place by every call."""
        return self.worker_error, self.server_error

    def to(self, device: torch.device) -> None:
        """Move both buffers to ``device`` (their values unchanged)."""
        self.worker_error = self.worker_error.to(device)
        self.server_error = self.server_error.to(device)

    def forget(self, coordinates: torch.Tensor) -> None:
        """Zero both buffers where the bool vector ``coordinates`` (``numel`` long) is True."""
        for buffer, start in zip(self.buffers(), self._starts):
            overlap = max(0, min(buffer.numel(), self.numel - start))
            if overlap:
                buffer[:overlap].masked_fill_(coordinates[start:start + overlap], 0.0)

    def reset(self) -> None:
        """Zero both buffers (when what they compensate changes meaning)."""
        self.worker_error.zero_()
        self.server_error.zero_()

    def state_dict(self) -> dict[str, Any]:
        """World size, rank, the vector's length and copies of both buffers: this rank's share (save one per rank)."""
        return {
            "world_size": self.world_size,
            "rank": self.rank,
            "numel": self.numel,
            "worker_error": self.worker_error.clone(),
            "server_error": self.server_error.clone(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Copy back what ``state_dict()`` saved, on the same rank of a same-size world, same layout."""
        check_owner(state, self.rank, self.world_size)
        for name, buf in (("worker_error", self.worker_error), ("server_error", self.server_error)):
            saved = state[name]
            if saved.shape != buf.shape:
                raise ValueError(
                    f"error-feedback checkpoint's {name} has shape {tuple(saved.shape)}, this layout's "
                    f"{tuple(buf.shape)}"
                )
            buf.copy_(saved)


class Plan(ABC):
    """One collective on tensors of one size on one device of one communicator.

    A plan is built once and then serves every call of that size:
    1. its layout (padding: ``full``; chunks, shards) is worked out at construction, or at the first
       call where it needs the node layout;
    2. its scratch buffers (a ``Workspace``) are allocated on the first call and reused;
    3. its agreement per (shape, dtype) reduces what the ranks must agree on to a
       signature, so each call exchanges only (signature, finite?, scale);
    4. it owns an ``ErrorFeedback`` when it is used without caller-owned buffers
       (``CompressedAllreduce``, the optimizers' channel).
    Calls on one plan run one at a time, in the communicator's order (``launch``).

    Subclasses give ``what``, the error-buffer layout and ``_run``.
    """

    what = "collective"

    def __init__(self, comm: Communicator, numel: int, device: torch.device, options: tuple[Option, ...]) -> None:
        self.comm = comm
        self.numel = numel
        self.device = torch.device(device)
        self.options = options
        self.full = padded_numel(numel, comm.size)
        self.workspace = Workspace()
        self.replays = Replays()
        self._agreements: dict[tuple[tuple[int, ...], torch.dtype], Agreement] = {}
        self._error_feedback: ErrorFeedback | None = None

    def agreement(self, tensor: torch.Tensor) -> Agreement:
        """The agreement for ``tensor``'s shape and dtype (built on first use)."""
        return kept(self._agreements, self.comm, self.what, self.numel, tensor, self.options)

    def agreed(self, agreement: Agreement, name: str, part: Callable[..., torch.Tensor], *args: Any,
               scale: tuple[int, str] | None = None, step: Step | None = None, host_scales: bool = True
               ) -> tuple[float, torch.Tensor | None]:
        """A call's agreement round on the float64 that its device part writes (a sum, or a finiteness test): the
        call's one host wait.

        1. ``part(*args, total)`` writes it into total[0] with no host wait, and returns ``total``
           (``Agreement.slot``: the sum's field of the agreement's record on the device where its round runs
           there); it runs through ``self.replays`` under ``name``, so a steady call replays its launches without
           their Python.
        2. ``agreement.check_total``: on the device where the transport runs the round there (NCCL's), else on
           the host after reading total[0]; ``scale`` = (d, "l2" or "l1") makes the value agreed on the float32
           scale of d elements from the sum; ``step`` is the caller's; ``host_scales=False`` spares a round on
           the device the host's scales (the caller reads the sums there: ``Agreement.device_sums``).

        Returns:
            This rank's value (0.0 without ``scale``), and every rank's values by rank (None without ``scale``).
        """
        total = agreement.slot(self.device)
        d, kind = scale if scale is not None else (0, None)
        return agreement.check_total(self.replays.run(name, part, *args, total), d, kind, step, host_scales)

    @property
    def error_feedback(self) -> ErrorFeedback:
        """This plan's own error buffers (created as zeros on first use)."""
        if self._error_feedback is None:
            worker, server = self.error_layout()
            self._error_feedback = ErrorFeedback(
                self.comm.rank, self.comm.size, self.numel, worker, server, self.device
            )
        return self._error_feedback

    def error_layout(self) -> tuple[tuple[int, int], tuple[int, int]]:
        """((worker length, worker start), (server length, server start)) in the padded vector."""
        raise TypeError(f"{self.what} keeps no error feedback")

    def to(self, device: torch.device) -> None:
        """Serve tensors on ``device`` from now on: its own error buffers move there, its scratch is dropped.

        Local: no rank is asked (the layout and agreements do not depend on the device).
        """
        self.device = torch.device(device)
        self.workspace = Workspace()
        self.replays = Replays()
        if self._error_feedback is not None:
            self._error_feedback.to(self.device)

    def start(
        self, tensor: torch.Tensor, out: torch.Tensor | None, async_op: bool,
        errors: tuple[torch.Tensor, torch.Tensor] | None = None, **call: Any,
    ) -> torch.Tensor | Work:
        """Run one call on checked arguments: blocking, or queued (``launch``).

        ``errors`` are caller-owned (worker, server) buffers; None means the plan's own
        where the collective has error feedback. ``call`` holds the collective's per-call
        options (Birder's seed and step).
        """
        result = torch.empty_like(tensor, memory_format=torch.contiguous_format) if out is None else out
        buffers: tuple[torch.Tensor, ...] = () if errors is None else errors
        return launch(self.comm, self.what, lambda: self._run(tensor, buffers, result, **call),
                      (tensor, *buffers, result), async_op)

    @abstractmethod
    def _run(self, tensor: torch.Tensor, errors: tuple[torch.Tensor, ...], result: torch.Tensor,
             **call: Any) -> torch.Tensor:
        """The algorithm's steps, in this rank's turn; returns ``result``."""


PLANS = "plans"
"""The name of a communicator's plans in its ``attached``: an OrderedDict of key to Plan, least recently used
first."""
_cache_lock = threading.Lock()


def cached_plan(comm: Communicator, key: Hashable, build: Callable[[], Plan]) -> Plan:
    """The plan kept for ``key`` on ``comm``, built by ``build()`` the first time.

    At most ``MAX_CACHED_PLANS`` are kept per communicator, in its ``attached``; the least
    recently used goes first (a call in flight keeps its own reference).
    """
    with _cache_lock:
        plans = comm.attached.setdefault(PLANS, OrderedDict())
        plan = plans.get(key)
        if plan is None:
            plan = build()
            plans[key] = plan
            if len(plans) > MAX_CACHED_PLANS:
                plans.popitem(last=False)
        else:
            plans.move_to_end(key)
        return plan


def cached_plans(comm: Communicator) -> int:
    """How many plans are kept for ``comm`` (for tests and memory reports)."""
    with _cache_lock:
        return len(comm.attached.get(PLANS, ()))
