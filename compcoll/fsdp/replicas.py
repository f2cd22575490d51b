"""HSDP's cross-replica allreduce in a few bits with error feedback, as FSDP2's all-reduce hook: ``ReplicaState``."""

from __future__ import annotations

from typing import Any, Callable

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import FSDPModule

from ..algorithms.agreement import agree_settings
from ..algorithms.keyed import CompressedAllreduce
from ..algorithms.replicas import Replicas
from ..comm.torchdist import own_comm, process_group_of
from ..errors import NonFiniteError
from .units import check_start_step, divides_itself, local_shards

BLOCK_SIZE = 64
"""Default elements per scale block (as ``compcoll.ddp.OneBitState``'s)."""
BITS = 4
"""The default bits per element (bench/results/convergence_fsdp_lm.txt)."""
REMEDY = ("replicas must be the group of the ranks that hold this rank's shard in the other replicas "
          "(mesh.get_group('replicate') of a (replicate, shard) mesh)")
"""What a ``ReplicaState`` whose ranks hold different shards should do (``algorithms.replicas``)."""


class ReplicaState:
    """The state of the cross-replica hook: its communicator, options and one error-buffer pair per FSDP unit.

    HSDP by hand: ``fully_shard`` over the ranks of one node (a 1-D mesh), and this state's
    group the ranks that hold the same shard on the other nodes. FSDP reduce-scatters
    inside the node as it always does; the hook then averages each reduced shard across
    the replicas with ``CompressedAllreduce`` (gather-scatter, ``bits`` per element, one
    scale per ``block_size`` elements), whose error buffers are the size of a shard: a
    padded shard and 1/r of it, in float32, for r replicas.

    Follows ``compcoll.ddp.OneBitState``: every argument has a default, it pickles, and
    ``state_dict()`` / ``load_state_dict()`` resume exactly.

    Args:
        process_group: the replicas of this rank's shard (a process group or a 1-D DeviceMesh); None means
            the default group. The calls run on a new group of the same ranks and backend.
        bits: bits per element: 4 (default: uniform levels, both compressions), or 1 (signs), 2,
            3, 8, as in ``compressed_allreduce``: bits/8 + 1/block_size bytes per element in each
            of its two exchanges.
        block_size: elements per scale (default 64; with 1 bit, None: one scale per shard and
            per server chunk).
        scale: 1 bit only: "l2" (default) or "l1".
        protocol: 1 bit only: "gather_scatter" (default) or "allgather".
        start_step: allreduces each unit sends uncompressed first (default 0).
        timeout: seconds a compressed call may take (None: ``COMPCOLL_TIMEOUT``, 300).
    """

    def __init__(self, process_group: dist.ProcessGroup | DeviceMesh | None = None, *, bits: int = BITS,
                 block_size: int | None = BLOCK_SIZE, scale: str = "l2", protocol: str = "gather_scatter",
                 start_step: int = 0, timeout: float | None = None) -> None:
        process_group = process_group_of(process_group, "ReplicaState")
        check_start_step("ReplicaState", start_step)
        self.process_group = process_group
        self.start_step, self.timeout = start_step, timeout
        self.comm = own_comm(process_group, timeout)
        agree_settings(self.comm, "ReplicaState", {"uncompressed first calls (start_step)": start_step})
        self.allreduce = CompressedAllreduce(self.comm, protocol=protocol, scale=scale, block_size=block_size,
                                             bits=bits)
        self.steps: dict[int, int] = {}
        self.replicas = Replicas("ReplicaState", REMEDY)

    def hook(self, key: int, unit: FSDPModule) -> Callable[[torch.Tensor], None]:
        """The all-reduce hook of unit ``key`` (``set_all_reduce_hook``); its first call checks that the replicas
        hold the same shards of the unit's parameters (``algorithms.replicas``)."""
        def all_reduce(shard: torch.Tensor) -> None:
            self.replicas.check(self.comm, lambda: local_shards(unit))
            self.all_reduce(key, shard, summed=divides_itself(unit))

        return all_reduce

    def all_reduce(self, key: int, shard: torch.Tensor, summed: bool = False) -> None:
        """Reduce unit ``key``'s reduced shard across the replicas, in place.

        1. Before ``start_step`` calls of this unit: the float sum over the replicas (divided
           by their number unless ``summed``).
        2. Otherwise ``CompressedAllreduce`` under the unit's key (``bits`` per element): the
           average over the replicas; times their number when ``summed`` (FSDP sums across replicas once a
           unit has its own divide factor).
        3. NaN / Inf on any replica: every rank's shard is NaN, and no error buffer changes.
        A float64 shard (float64 parameters or ``reduce_dtype``) goes through a float32 copy, as
        ``ReduceScatterState``'s float64 gradients.
        """
        step = self.steps.get(key, 0)
        self.steps[key] = step + 1
        replicas = self.comm.size
        if step < self.start_step:
            dist.all_reduce(shard, group=self.process_group)
        else:
            piece = shard.float() if shard.dtype == torch.float64 else shard
            try:
                self.allreduce(piece, key=key, out=piece)
            except NonFiniteError:
                shard.fill_(float("nan"))
                return
            if piece is not shard:
                shard.copy_(piece)
        if (step < self.start_step) != summed:
            shard.mul_(replicas) if summed else shard.div_(replicas)

    def memory(self) -> int:
        """Bytes of this rank's error buffers."""
        return sum(sum(b.numel() * 4 for b in plan.error_feedback.buffers()) for plan in self.allreduce.plans.values())

    def state_dict(self) -> dict[str, Any]:
        """The options, each unit's step count (as (unit, count) pairs) and this rank's error buffers (save one per
        process; ``CompressedAllreduce.state_dict``)."""
        return {"start_step": self.start_step, "steps": sorted(self.steps.items()),
                "error_feedback": self.allreduce.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what ``state_dict()`` saved: options and step counts, and this rank's own error buffers (another
        rank's or world size's restart at zero, with a warning)."""
        self.allreduce.load_state_dict(state["error_feedback"], "ReplicaState")
        self.start_step = state["start_step"]
        self.steps = dict(state["steps"])

    def __getstate__(self) -> dict[str, Any]:
        """Pickle the ``state_dict()`` and the timeout; the process group is not picklable."""
        return {"state": self.state_dict(), "timeout": self.timeout}

    def __setstate__(self, saved: dict[str, Any]) -> None:
        """Unpickle onto the default process group (every rank at the same point: it makes a group)."""
        state = saved["state"]
        saved_ef = state["error_feedback"]
        self.__init__(None, bits=saved_ef["bits"], block_size=saved_ef["block_size"], scale=saved_ef["scale"],
                      protocol=saved_ef["protocol"], start_step=state["start_step"], timeout=saved["timeout"])
        self.load_state_dict(state)
