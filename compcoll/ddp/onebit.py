"""The error-compensated 1-bit DDP hook: ``model.register_comm_hook(OneBitState(), onebit_hook)``."""

import warnings
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh

from ..algorithms.agreement import agree_settings
from ..algorithms.hierarchical import hierarchical_compressed_allreduce, hierarchical_error_numels
from ..algorithms.inputs import check_protocol, check_scale
from ..algorithms.keyed import CompressedAllreduce
from ..algorithms.parts import packed, unpacked
from ..algorithms.replicas import Replicas
from ..comm.topology import AUTO, node_size, topology
from ..spec import check_block_size
from ..comm.torchdist import TorchComm, group_ready, own_comm, process_group_of, require_group
from .buckets import DDP_REMEDY, Schedule, check_bucket, dense, gather, in_float32, plain_allreduce, settle
from .one_model import OneModel

BLOCK_SIZE = 64
"""The hook's default elements per 1-bit scale block (bench/results/scaling_hooks.txt)."""

MIN_COMPRESS_NUMEL = 16384
"""Buckets below this many elements (64 KiB of float32) go uncompressed: a compressed call has a fixed cost
(0.4-0.6 ms for 4 KB on 2 local ranks here), about what such a bucket's ring allreduce takes at 1 Gbit/s."""


class OneBitState:
    """The state of ``onebit_hook``: its communicator, schedule and one error-feedback pair per DDP bucket.

    Modelled on PyTorch's ``PowerSGDState``: every argument has a default, it pickles
    (``torch.save(state)``, also before it took its group, as Lightning's spawning launcher
    pickles it to each new process) and has ``state_dict()`` / ``load_state_dict()`` for an
    exact resume. Build it on every rank at the same point: it makes a process group and, on
    several nodes, the node groups (on the caller's thread, so no group is made in the
    background where a thread-local world such as torch's threaded group has none), and
    checks that every rank's ``start_iter`` and ``min_compress_numel`` agree
    (``RankMismatchError`` on every rank otherwise: they decide which group a bucket goes to).
    Built before ``init_process_group`` (as a framework builds it from its configuration:
    Lightning's ``DDPStrategy(ddp_comm_state=OneBitState(), ddp_comm_hook=onebit_hook)``, as
    for ``PowerSGDState``), it does all that at its first use instead (``bind``): the hook's
    first bucket, which every rank reaches at the same point; a state loaded before then
    (``load_state_dict``, or a pickle loaded before ``init_process_group``) is applied there.

    Tuning, in this order (bytes per element sent per rank per compressed step; a float32
    ring allreduce sends 8(n-1)/n; figures from bench/results/scaling_hooks.txt: the
    digits MLP under DDP, momentum SGD, global batch 256 split over n ranks, test accuracy
    against DDP's allreduce at the same n):
    1. ``block_size`` (64, default) with ``protocol="gather_scatter"`` (default): both
       compressions take one scale per 64 elements, sent as an 8-bit code, so each of the
       two exchanges sends 1/8 + 1/64 bytes per element: 2(n-1)/n * 0.14, 1/28 of the ring
       (counted on compressed steps: 28x, 28x, 26x and 25x at 2, 16, 64 and 256 ranks, the
       agreement included); +0.56, +0.56 and +0.28 points at 2, 16 and 64 ranks (-0.28 at
       256). At 1024 ranks a 262k-element bucket's chunks are 264 elements, whose scales
       and padding bring the cut to 24x; from about 1M elements it keeps 1/25. 32 sends 1/25
       (+0.00 points at each); 128 sends 1/29 (+0.00 / -2.50 / -2.78 points).
       ``block_size=None`` (one scale per bucket and per server chunk, DeepSpeed's
       numerics) sends 1/32 but lost -0.56, -8.06 and -9.44 points.
    2. ``protocol="allgather"`` compresses once (the server's second compression goes) and
       sends (n-1)/8 (1 + 8/B) per element: fewer bytes than gather-scatter only at 2 ranks,
       n/2 times more beyond (with ``block_size=None``: -0.28, -1.11, -0.83 points at 2, 16
       and 64 ranks, 1/32, 1/4 and 1x the ring).
    3. ``ranks_per_node`` ("auto"): on several nodes the hierarchical form sends float32
       inside a node and 1/k of gather-scatter's 1-bit bytes per rank between nodes (k
       ranks per node), with the block scales between nodes: +0.00 points at 2 nodes of 8
       and at 8 nodes of 8. With one scale per chunk (``block_size=None``) it lost -3.33
       and -9.44 points.
    4. ``start_iter`` and ``min_compress_numel``: every uncompressed iteration or bucket
       sends the ring's bytes.
    5. ``scale``: free in bytes ("l2" chosen on digits at 2 and 4 ranks).
    PyTorch's PowerSGD hook (rank 2) also kept DDP's accuracy on that task, at 1/31 of the
    ring from 2 to 64 ranks; for Adam and LAMB, compcoll's optimizers compress their
    momentum instead of raw gradients (docs/guides/scale.md).

    Args:
        process_group: the ranks DDP averages over (a process group or a 1-D DeviceMesh); None means the
            default group. The hook runs its compressed calls on a new group of the same ranks
            and backend (Gloo on CPU, NCCL on GPU), so that they never interleave with DDP's own
            collectives. It must hold DDP's replicas: the first bucket checks it.
        start_iter: iterations sent uncompressed first (DDP's own allreduce), while DDP
            rebuilds its buckets; at least 1 (default 2, as PowerSGD requires).
        min_compress_numel: buckets of fewer elements go uncompressed (default 16384).
        protocol: "gather_scatter" (default: compressed twice, through a server chunk, as
            DeepSpeed's 1-bit Adam; 2(n-1)/(8n) bytes per element plus the scales) or
            "allgather" (each rank compresses once, every rank averages all ranks' signs;
            (n-1)/8 bytes per element sent per rank plus the scales).
        ranks_per_node: "auto" (default): the nodes the hostnames say (or
            ``COMPCOLL_RANKS_PER_NODE``), agreed by every rank when the state is built
            (``compcoll.comm.topology.node_size``): on one host, or with one rank per node,
            the flat form. 1: the flat form. k > 1: k consecutive ranks share a node. With
            k > 1 ranks per node, buckets go through ``hierarchical_compressed_allreduce``
            (float32 inside the node, gather-scatter 1-bit between nodes: 2(N-1)/(8N) bytes
            per element between N nodes, 1/k of them per rank; ``protocol`` does not apply).
            The resolved k is what ``self.ranks_per_node`` holds; the buckets go by the
            layout that was asked for (``self.layout_request``), so "auto" keeps the
            hostnames' nodes even where ranks are not placed consecutively.
        scale: "l2" (default: ||x|| / sqrt(d), DeepSpeed's) or "l1" (mean |x|). Chosen by
            bench/convergence/ddp.py (digits, momentum SGD, 2 and 4 ranks): one compression
            with l2 ended +0.28 points of test accuracy against DDP's allreduce at both, l1
            -0.83 and -2.22; gather-scatter with l2 +0.56 and -4.17, with l1 it diverged.
        timeout: seconds a compressed call may take (None: ``COMPCOLL_TIMEOUT``, 300).
        block_size: 64 (default) or another power of two from 8 to 8192: one scale per block
            of that many elements, sent as an 8-bit code (``compressed_allreduce``); None: one
            scale per bucket, and per server chunk. The hierarchical form takes them between
            nodes.
    """

    def __init__(
        self,
        process_group: dist.ProcessGroup | DeviceMesh | None = None,
        *,
        start_iter: int = 2,
        min_compress_numel: int = MIN_COMPRESS_NUMEL,
        protocol: str = "gather_scatter",
        scale: str = "l2",
        ranks_per_node: int | str = "auto",
        timeout: float | None = None,
        block_size: int | None = BLOCK_SIZE,
    ) -> None:
        process_group = process_group_of(process_group, "OneBitState")
        if isinstance(start_iter, int) and start_iter < 1:
            raise ValueError("OneBitState: start_iter must be at least 1: DDP rebuilds its buckets after the first "
                             "iteration, and error buffers are kept per bucket")
        check_protocol("OneBitState", protocol)
        check_scale("OneBitState", scale)
        check_block_size("OneBitState", block_size)
        if ranks_per_node != AUTO and (isinstance(ranks_per_node, bool) or not isinstance(ranks_per_node, int)
                                       or ranks_per_node < 1):
            raise ValueError(f"OneBitState: ranks_per_node must be \"auto\" or a positive divisor of the group's "
                             f"ranks, got {ranks_per_node!r}")
        self.node_buffers: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        self.process_group = process_group
        self.timeout = timeout
        self.schedule = Schedule(start_iter, min_compress_numel)
        self.layout_request = ranks_per_node
        self._numerics = {"protocol": protocol, "scale": scale, "block_size": block_size}
        self.comm: TorchComm | None = None
        self.ranks_per_node: int | None = None
        self.allreduce: CompressedAllreduce | None = None
        self.layouts: dict[int, list[list[int]]] = {}
        self._seen: dict[int, list[list[int]]] = {}
        self._last_seen: dict[int, list[list[int]]] | None = None
        self._untiled = 0
        self._model = OneModel("OneBitState")
        self.replicas = Replicas("OneBitState", DDP_REMEDY.format(owner="OneBitState"))
        self._pending: dict[str, Any] | None = None
        if group_ready(process_group):
            self.bind()

    def bind(self) -> None:
        """Take the state's group and build what runs on it, once (every rank at the same point).

        1. The group given, or the default group (a state built before ``init_process_group``,
           as Lightning's ``DDPStrategy(ddp_comm_state=...)`` builds it, takes it here, at the
           hook's first bucket or at ``state_dict``: ``require_group`` raises where there is
           still none).
        2. Check ``ranks_per_node`` divides its ranks; make the state's own group of those ranks
           (``own_comm``); agree on ``start_iter`` and ``min_compress_numel`` with every rank
           (``RankMismatchError`` on every rank otherwise).
        3. Resolve ``ranks_per_node`` ("auto": the hostnames' nodes) and, with several ranks per
           node, build the node groups; then the ``CompressedAllreduce`` of the buckets.
        4. Load the state given to ``load_state_dict`` before there was a group, if any.
        """
        if self.comm is not None:
            return
        require_group(self.process_group, "OneBitState")
        size = dist.get_world_size(self.process_group)
        if self.layout_request != AUTO and size % self.layout_request:
            raise ValueError(f"OneBitState: ranks_per_node must be \"auto\" or a positive divisor of the group's "
                             f"{size} ranks, got {self.layout_request!r}")
        comm = own_comm(self.process_group, self.timeout)
        agree_settings(comm, "OneBitState", self.schedule.settings())
        self.ranks_per_node = node_size(comm) if self.layout_request == AUTO else self.layout_request
        if self.ranks_per_node > 1:
            topology(comm, self.layout_request)
        self.allreduce = CompressedAllreduce(comm, **self._numerics)
        self.comm = comm
        if self._pending is not None:
            pending, self._pending = self._pending, None
            self.load_state_dict(pending)

    def segments(self, bucket: dist.GradBucket) -> list[tuple[int, list[tuple[int, int]]]] | None:
        """The error-buffer keys this bucket is compressed under, each with the (offset, length) spans of its
        parameters.

        1. A bucket whose parameters (their shapes, in order) are those its index held
           before, or an index not seen yet: one key, the index, one span.
        2. Otherwise (a DDP built afresh on resume runs its first iteration with the
           buckets it had before its rebuild: parameters in registration order, often in
           one bucket): the known buckets whose parameters it holds, each gathered in its
           own order (a shape's last occurrence here is its first there, since DDP rebuilds
           in the order backward produces gradients), so the resumed run compresses what
           the uninterrupted run would have.
        3. None when known buckets do not tile it (one straddles two of its buckets, or
           the model changed): this iteration goes uncompressed, error buffers kept. An
           iteration with such a bucket whose buckets are those of the iteration before
           (DDP's buckets have settled: a new DDP over a changed model, as after unfreezing
           layers) makes its buckets the known ones at its end (``end_iteration``).
        DDP gives every rank the same buckets, so every rank decides alike. A second DDP
        model's buckets are refused (``OneModel``: ``ValueError`` on every rank).
        """
        index, params = bucket.index(), bucket.parameters()
        self._model.check(index, params)
        shapes = [list(p.shape) for p in params]
        self._seen[index] = shapes
        found = self._tile(index, shapes, params, bucket)
        self._untiled += found is None
        return found

    def end_iteration(self) -> None:
        """At an iteration's last bucket: if some bucket could not be tiled (``segments``) and every bucket is as
        in the iteration before, take this iteration's buckets as the known ones, with every error buffer afresh
        (they compensated other parameters) and a warning; otherwise the hook would send every such bucket
        uncompressed from now on, with nothing said (32x the bytes)."""
        if self._untiled and self._seen == self._last_seen:
            warnings.warn(
                f"OneBitState: DDP's buckets now hold other parameters than its error buffers were kept for (a new "
                f"DDP over a changed model, e.g. after unfreezing layers); {self._untiled} bucket(s) of this "
                f"iteration went uncompressed. From the next iteration these buckets are compressed again, their "
                f"error buffers starting at zero", stacklevel=3)
            self.layouts = {index: shapes for index, shapes in self._seen.items()}
            self.allreduce.clear()
            self.node_buffers.clear()
        self._last_seen, self._seen, self._untiled = self._seen, {}, 0
        self._model.end_iteration()

    def _tile(self, index: int, shapes: list[list[int]], params: list[torch.Tensor], bucket: dist.GradBucket
              ) -> list[tuple[int, list[tuple[int, int]]]] | None:
        """Steps 1-3 of ``segments`` for a bucket of ``params`` (of ``shapes``) at ``index``."""
        if self.layouts.setdefault(index, shapes) == shapes:
            return [(index, [(0, bucket.buffer().numel())])]
        offset = 0
        unused: dict[tuple[int, ...], list[tuple[int, int]]] = {}
        for p in params:
            unused.setdefault(tuple(p.shape), []).append((offset, p.numel()))
            offset += p.numel()
        segments = []
        for key in sorted(self.layouts):
            wanted = [tuple(s) for s in self.layouts[key]]
            available = [len(unused.get(s, ())) >= wanted.count(s) for s in wanted]
            if any(available) and not all(available):
                return None
            if all(available):
                segments.append((key, [unused[s].pop() for s in wanted]))
        return segments if not any(unused.values()) else None

    def state_dict(self) -> dict[str, Any]:
        """The iteration, the options, the buckets' layouts (as (bucket, shapes) pairs) and this rank's error buffers
        per bucket (save one per process): the allreduce's (``CompressedAllreduce.state_dict``) and the hierarchical
        form's, packed under the process's key (``parts.packed``: ``torch.distributed.checkpoint`` keeps every
        process's)."""
        self.bind()
        return packed({
            "iteration": self.schedule.iteration,
            "start_iter": self.schedule.start_iter,
            "min_compress_numel": self.schedule.min_compress_numel,
            "layouts": sorted((k, [list(s) for s in v]) for k, v in self.layouts.items()),
            "error_feedback": self.allreduce.state_dict(),
            "ranks_per_node": self.ranks_per_node,
            "job": [self.comm.job_rank, self.comm.job_size],
            "node_buffers": {k: (w.clone(), e.clone()) for k, (w, e) in self.node_buffers.items()},
        }, ("node_buffers",))

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what ``state_dict()`` saved: the schedule, the buckets the error buffers are kept for (DDP's,
        alike on every rank of any world size) and, from this rank's own state (same rank of a same-size world), the
        error buffers; from another rank's or world size's (an elastic restart), a warning, and they restart at
        zero. A state of the layout before 2026-12-01 (nothing packed: ``parts.unpacked``) loads too. Given to a
        state that has not taken its group while there is none (before ``init_process_group``), it is kept and
        loaded when the state takes it (``bind``)."""
        if self.comm is None and not group_ready(self.process_group):
            self._pending = state
            return
        self.bind()
        state = unpacked(state)
        own = self.allreduce.load_state_dict(state["error_feedback"], "OneBitState")
        if own and state["ranks_per_node"] != self.ranks_per_node:
            raise ValueError(f"OneBitState: the checkpoint is for ranks_per_node={state['ranks_per_node']}, this "
                             f"state has {self.ranks_per_node}")
        self.node_buffers = {k: (w.clone(), e.clone()) for k, (w, e) in state["node_buffers"].items()} if own else {}
        self.schedule = Schedule(state["start_iter"], state["min_compress_numel"])
        self.schedule.iteration = state["iteration"]
        self.layouts = {k: [list(s) for s in v] for k, v in dict(state["layouts"]).items()}

    def __getstate__(self) -> dict[str, Any]:
        """Pickle the options and the ``state_dict()``, or the state still to load (None) where the state has not
        taken its group; the process group is not picklable (PowerSGD drops it too)."""
        state = self.state_dict() if self.comm is not None else self._pending
        return {"options": self._options(), "state": state}

    def __setstate__(self, saved: dict[str, Any]) -> None:
        """Unpickle onto the default process group, with the saved options, and load the saved state: now where that
        group exists (every rank at the same point: it makes a group), else when the state takes it (``bind``). A
        pickle made before 2026-12-03 (no options: they are read from its state) loads too."""
        state = saved["state"]
        options = saved.get("options") or {
            "start_iter": state["start_iter"], "min_compress_numel": state["min_compress_numel"],
            "protocol": state["error_feedback"]["protocol"], "scale": state["error_feedback"]["scale"],
            "ranks_per_node": saved.get("layout_request", state["ranks_per_node"]), "timeout": saved["timeout"],
            "block_size": state["error_feedback"].get("block_size")}
        self.__init__(None, **options)
        if state is not None:
            self.load_state_dict(state)

    def _options(self) -> dict[str, Any]:
        """The arguments that build this state again, the process group aside."""
        return {"start_iter": self.schedule.start_iter, "min_compress_numel": self.schedule.min_compress_numel,
                "ranks_per_node": self.layout_request, "timeout": self.timeout, **self._numerics}


def onebit_hook(state: OneBitState, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """Average a DDP bucket with error-compensated 1-bit compression, overlapping the rest of backward.

    1. Before ``state.start_iter`` iterations, for buckets below ``min_compress_numel``
       elements, and for a sparse gradient's bucket: DDP's own allreduce (float sum / n).
    2. Otherwise ``CompressedAllreduce`` of the bucket's flat buffer (with ``ranks_per_node``
       > 1, ``hierarchical_compressed_allreduce``), in place, keyed by the
       bucket index (its error buffers), started asynchronously on the state's
       communicator: the future completes while backward computes earlier buckets. (After
       a resume, a bucket DDP has not rebuilt yet goes in the parts ``state.segments``
       says, each gathered, compressed under its own key and put back.)
    3. A float64 bucket (float64 or complex128 parameters) goes through a float32 copy
       (``buckets.in_float32``).
    4. A NaN / Inf in any rank's bucket: every rank gets the bucket filled with NaN, as
       DDP's allreduce would give, with the error buffers unchanged, so a ``GradScaler``
       skips the step on every rank and nothing is lost.
    Every rank ends with the same bits.

    Args:
        state: a ``OneBitState``.
        bucket: the DDP gradient bucket (float32, float16, bfloat16, float64; complex parameters as DDP views them,
            as pairs of reals).

    Returns:
        A future of the averaged flat buffer.
    """
    check_bucket("onebit_hook", bucket)
    state.bind()
    state.replicas.check(state.comm, bucket.parameters)
    schedule = state.schedule
    segments = state.segments(bucket) if schedule.started() and dense(bucket) else None
    buffer = bucket.buffer()
    if segments is None:
        future = plain_allreduce(buffer, state.process_group)
    elif len(segments) == 1 and len(segments[0][1]) == 1:
        future = in_float32(lambda piece: _compress(state, segments[0][0], piece), buffer)
    else:
        future = in_float32(lambda whole: gather([_compress_spans(state, key, spans, whole)
                                                  for key, spans in segments], whole), buffer)
    if schedule.started() and bucket.is_last():
        state.end_iteration()
    schedule.advance(bucket)
    return future


def _compress(state: OneBitState, key: int, piece: torch.Tensor) -> torch.futures.Future:
    """A future of ``piece`` averaged in place: compressed under ``key``, or plain below ``min_compress_numel``."""
    if piece.numel() < state.schedule.min_compress_numel:
        return plain_allreduce(piece, state.process_group)
    k = state.ranks_per_node
    if k == 1:
        return settle(state.allreduce(piece, key=key, out=piece, async_op=True), piece)
    block = state.allreduce.block_size
    lengths = hierarchical_error_numels(piece.numel(), state.comm.size, k)
    buffers = state.node_buffers.get(key)
    if buffers is None or (buffers[0].numel(), buffers[1].numel()) != lengths:
        buffers = tuple(torch.zeros(length, device=piece.device) for length in lengths)
        state.node_buffers[key] = buffers
    elif buffers[0].device != piece.device:  # loaded from compcoll.checkpoint's files (on the CPU): values kept
        buffers = tuple(buffer.to(piece.device) for buffer in buffers)
        state.node_buffers[key] = buffers
    work = hierarchical_compressed_allreduce(piece, *buffers, state.comm, ranks_per_node=state.layout_request,
                                             out=piece, async_op=True, scale=state.allreduce.scale, block_size=block)
    return settle(work, piece)


def _compress_spans(state: OneBitState, key: int, spans: list[tuple[int, int]], buffer: torch.Tensor
                    ) -> torch.futures.Future:
    """Gather ``spans`` of ``buffer`` in order, average them under ``key`` and scatter the result back."""
    piece = torch.cat([buffer[a:a + n] for a, n in spans])

    def scatter(future: torch.futures.Future) -> torch.Tensor:
        result, start = future.value(), 0
        for a, n in spans:
            buffer[a:a + n].copy_(result[start:start + n])
            start += n
        return buffer

    return _compress(state, key, piece).then(scatter)
