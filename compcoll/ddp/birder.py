"""Birder's unbiased hierarchical 1-bit DDP hook: ``model.register_comm_hook(BirderState(), birder_hook)``."""

from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh

from ..algorithms.agreement import agree_settings
from ..algorithms.birder import hierarchical_allreduce
from ..algorithms.replicas import Replicas
from ..comm.topology import topology
from ..comm.torchdist import TorchComm, group_ready, own_comm, process_group_of, require_group
from .buckets import DDP_REMEDY, Schedule, check_bucket, in_float32, plain_allreduce, settle
from .onebit import MIN_COMPRESS_NUMEL


class BirderState:
    """The state of ``birder_hook``: its communicator, the node layout, the seed and the call counter.

    Birder's compression is unbiased (binary randomization) and keeps no error buffers, so
    it may start at the first iteration. Build it on every rank at the same point: it makes a
    process group and the node groups (on the caller's thread, as ``OneBitState`` does), or,
    built before ``init_process_group``, at the hook's first bucket (``bind``).

    Args:
        process_group: the ranks DDP averages over (a process group or a 1-D DeviceMesh); None means the
            default group (the calls run on a new group of the same ranks, as ``OneBitState``'s).
            It must hold DDP's replicas: the first bucket checks it.
        ranks_per_node: k consecutive ranks form a node; "auto" (default; None too)
            discovers the nodes from hostnames (or ``COMPCOLL_RANKS_PER_NODE``).
        seed: the random seed; a run is reproduced from it.
        start_iter: iterations sent uncompressed first (default 0).
        min_compress_numel: buckets of fewer elements go uncompressed.
        timeout: seconds a compressed call may take (None: ``COMPCOLL_TIMEOUT``, 300).
    """

    def __init__(
        self,
        process_group: dist.ProcessGroup | DeviceMesh | None = None,
        *,
        ranks_per_node: int | str | None = "auto",
        seed: int = 0,
        start_iter: int = 0,
        min_compress_numel: int = MIN_COMPRESS_NUMEL,
        timeout: float | None = None,
    ) -> None:
        process_group = process_group_of(process_group, "BirderState")
        self.process_group = process_group
        self.ranks_per_node = ranks_per_node
        self.seed = seed
        self.timeout = timeout
        self.schedule = Schedule(start_iter, min_compress_numel)
        self.comm: TorchComm | None = None
        self.calls = 0
        self.replicas = Replicas("BirderState", DDP_REMEDY.format(owner="BirderState"))
        if group_ready(process_group):
            self.bind()

    def bind(self) -> None:
        """Take the state's group and build what runs on it, once (every rank at the same point).

        1. The group given, or the default group (a state built before ``init_process_group``
           takes it here, at the hook's first bucket, as ``OneBitState.bind``).
        2. Make the state's own group of its ranks (``own_comm``); agree on the schedule and
           the seed with every rank (``RankMismatchError`` on every rank otherwise).
        3. Build the node groups of ``ranks_per_node``.
        """
        if self.comm is not None:
            return
        require_group(self.process_group, "BirderState")
        comm = own_comm(self.process_group, self.timeout)
        agree_settings(comm, "BirderState", {**self.schedule.settings(), "seeds": self.seed})
        topology(comm, self.ranks_per_node)
        self.comm = comm

    def state_dict(self) -> dict[str, Any]:
        """The iteration, the compressed-call counter (the random streams' step) and the options."""
        return {"iteration": self.schedule.iteration, "calls": self.calls, "seed": self.seed,
                "start_iter": self.schedule.start_iter, "min_compress_numel": self.schedule.min_compress_numel}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what ``state_dict()`` saved: the next call draws the bits the saved run's would."""
        self.schedule = Schedule(state["start_iter"], state["min_compress_numel"])
        self.schedule.iteration = state["iteration"]
        self.calls, self.seed = state["calls"], state["seed"]

    def __getstate__(self) -> dict[str, Any]:
        """Pickle the ``state_dict()`` and the options; the process group is not picklable (PowerSGD drops it too)."""
        return {"state": self.state_dict(), "ranks_per_node": self.ranks_per_node, "timeout": self.timeout}

    def __setstate__(self, saved: dict[str, Any]) -> None:
        """Unpickle onto the default process group (every rank at the same point: it makes a group; before
        ``init_process_group``, at the first bucket), built with the saved seed and schedule, so that the ranks
        agree on those, and continue from the saved counters."""
        state = saved["state"]
        self.__init__(None, ranks_per_node=saved["ranks_per_node"], seed=state["seed"], start_iter=state["start_iter"],
                      min_compress_numel=state["min_compress_numel"], timeout=saved["timeout"])
        self.load_state_dict(state)


def birder_hook(state: BirderState, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """Average a DDP bucket with Birder's all-1-bit hierarchical allreduce (``hierarchical_allreduce``).

    1. Before ``start_iter`` iterations, below ``min_compress_numel`` elements and for a sparse
       gradient's bucket: DDP's own allreduce.
    2. Otherwise ``hierarchical_allreduce`` of the flat buffer in place, asynchronously, with
       the state's seed and its call counter as the step (so a resumed run draws the same
       bits); an unbiased estimate of the average, the same bits on every rank.
    3. A NaN / Inf on any rank: the bucket is NaN on every rank (as ``onebit_hook``); a float64
       bucket goes through a float32 copy (``buckets.in_float32``).

    Args:
        state: a ``BirderState``.
        bucket: the DDP gradient bucket.

    Returns:
        A future of the averaged flat buffer.
    """
    check_bucket("birder_hook", bucket)
    state.bind()
    state.replicas.check(state.comm, bucket.parameters)
    schedule = state.schedule
    if schedule.compress(bucket):
        future = in_float32(lambda buffer: _average(state, buffer), bucket.buffer())
    else:
        future = plain_allreduce(bucket.buffer(), state.process_group)
    schedule.advance(bucket)
    return future


def _average(state: BirderState, buffer: torch.Tensor) -> torch.futures.Future:
    """Step 2 of ``birder_hook`` on ``buffer``: a future of it averaged in place; the call counter moves on."""
    work = hierarchical_allreduce(buffer, state.comm, ranks_per_node=state.ranks_per_node, seed=state.seed,
                                  step=state.calls, out=buffer, async_op=True)
    state.calls += 1
    return settle(work, buffer)
