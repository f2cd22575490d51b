"""``CompressedAllreduce``: the error-compensated 1-bit allreduce, its error buffers kept per key."""

from __future__ import annotations

from typing import Any, Hashable

import torch

from ..comm import Communicator, communicator
from ..comm.work import Work
from ..eager import eager
from ..spec import check_bits, check_block_size
from .arrays import accepts_arrays
from .inputs import check_disjoint, check_levels, check_protocol, check_scale, check_tensor
from .launch import settle_device
from .onebit import FlatPlan
from .parts import packed, unpacked
from .plan import owned
from .rounds import checked


class CompressedAllreduce:
    """``compressed_allreduce`` that keeps the error-feedback buffers for the caller, one plan per key.

    Usage::

        allreduce = compcoll.CompressedAllreduce(comm)
        avg = allreduce(grad, key="layer1.weight")
        torch.save(allreduce.state_dict(), f"ef-rank{comm.rank}.pt")

    1. Look up the key's plan (built on first sight of the key, with error buffers of
       zeros, for the tensor's size and device).
    2. Run it (``async_op=True``: return its Work; calls on different keys may be in
       flight together).

    Args:
        comm: the communicator; None means ``compcoll.get_default()`` at construction.
        protocol: "gather_scatter" (default) or "allgather".
        scale: "l2" (default) or "l1", as in ``compressed_allreduce``.
        block_size: None (default) or elements per scale block, as in ``compressed_allreduce``.
        bits: 1 (default) or 2-8 levels, as in ``compressed_allreduce``.
    """

    def __init__(self, comm: Communicator | None = None, *, protocol: str = "gather_scatter",
                 scale: str = "l2", block_size: int | None = None, bits: int = 1) -> None:
        check_protocol("CompressedAllreduce", protocol)
        check_scale("CompressedAllreduce", scale)
        check_block_size("CompressedAllreduce", block_size)
        check_levels("CompressedAllreduce", bits, protocol, block_size)
        self.bits = bits
        self.comm = communicator(comm, "CompressedAllreduce")
        self.protocol = protocol
        self.scale = scale
        self.block_size = block_size
        self.plans: dict[Hashable, FlatPlan] = {}

    def plan(self, key: Hashable, tensor: torch.Tensor) -> FlatPlan:
        """The plan of ``key`` (built for ``tensor``, a checked input, on first use).

        1. A key used before with another number of elements: ValueError.
        2. A key whose buffers are on another device than ``tensor`` (loaded from
           ``compcoll.checkpoint``'s files, which map to the CPU, or the model moved): its
           buffers follow ``tensor`` there, values kept, in this rank's turn (behind calls in
           flight on them). Before 2026-12-01 this raised ValueError, so a GPU run resumed
           from ``compcoll.checkpoint`` failed at its first compressed call.
        """
        plan = self.plans.get(key)
        if plan is None:
            plan = FlatPlan(self.comm, tensor.numel(), tensor.device, self.protocol, None, self.scale,
                            self.block_size, self.bits)
            self.plans[key] = plan
        elif plan.numel != tensor.numel():
            raise ValueError(
                f"CompressedAllreduce: key {key!r} holds buffers for {plan.numel} elements, but this tensor has "
                f"{tensor.numel()}; use a new key for it"
            )
        elif plan.device != tensor.device:
            self.comm.run(lambda: plan.to(tensor.device), "CompressedAllreduce.to")
        return plan

    @eager
    @accepts_arrays
    def __call__(
        self, tensor: torch.Tensor, key: Hashable = "default", *, out: torch.Tensor | None = None,
        async_op: bool = False
    ) -> torch.Tensor | Work:
        def checks() -> FlatPlan:
            check_tensor("CompressedAllreduce", tensor, out, self.comm.carries_meta)
            check_disjoint("CompressedAllreduce", (("tensor", tensor), ("out", out)))
            return self.plan(key, tensor)

        plan = checked(self.comm, FlatPlan.what, checks)
        return plan.start(tensor, out, async_op, plan.error_feedback.buffers())

    def clear(self) -> None:
        """Drop every key's plan and error buffers: each key starts afresh at its next call."""
        self.plans.clear()

    def state_dict(self) -> dict[str, Any]:
        """This rank's protocol, scale, block size and every key's error buffers (save one per process), with whose
        they are (the rank of the group and the process of the job: ``plan.owned``), the buffers and the rank packed
        under the process's key (``parts.packed``: ``torch.distributed.checkpoint`` keeps every process's), as they are
        once every call issued before it has run: it takes its turn in the communicator's order (``Communicator.run``)
        behind asynchronous calls still in flight, which would otherwise be copied half written."""
        return self.comm.run(self._state_dict, "CompressedAllreduce.state_dict")

    def _state_dict(self) -> dict[str, Any]:
        for plan in self.plans.values():
            settle_device(plan.device)
        return packed({
            "protocol": self.protocol,
            "scale": self.scale,
            "block_size": self.block_size,
            "bits": self.bits,
            "world_size": self.comm.size,
            "rank": self.comm.rank,
            "job": [self.comm.job_rank, self.comm.job_size],
            "buffers": {k: p.error_feedback.state_dict() for k, p in self.plans.items()},
        }, ("rank", "buffers"))

    def load_state_dict(self, state: dict[str, Any], what: str = "CompressedAllreduce") -> bool:
        """Restore what ``state_dict()`` saved; keys are rebuilt from it (new plans: calls in flight finish on the
        buffers they started with, and the next calls start from the loaded ones). Another rank's or world size's
        state (``plan.owned``: a warning naming ``what``, the state that holds this one) gives the options only:
        every key's error buffers restart at zero. Returns whether the state was this rank's own. A state of the
        layout before 2026-12-01 (nothing packed: ``parts.unpacked``) loads too."""
        state = unpacked(state)
        own = owned(state, self.comm, what)
        check_protocol("CompressedAllreduce checkpoint", state["protocol"])
        self.protocol = state["protocol"]
        self.scale = state.get("scale", "l2")
        check_scale("CompressedAllreduce checkpoint", self.scale)
        self.block_size = state.get("block_size")
        check_block_size("CompressedAllreduce checkpoint", self.block_size)
        self.bits = state.get("bits", 1)
        check_bits("CompressedAllreduce checkpoint", self.bits)
        plans = {}
        for key, saved in state["buffers"].items() if own else ():
            worker = saved["worker_error"]
            plan = FlatPlan(self.comm, saved["numel"], worker.device, self.protocol, None, self.scale,
                            self.block_size, self.bits)
            plan.error_feedback.load_state_dict(saved)
            plans[key] = plan
        self.plans = plans
        return own
