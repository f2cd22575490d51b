"""Birder's all-1-bit hierarchical allreduce: binarized in nodes, between nodes, then served (docs/architecture.md)."""

from __future__ import annotations

import weakref

import torch

from .. import codecs
from ..comm import Communicator, communicator
from ..comm.topology import requested_ranks_per_node
from ..comm.work import Work
from ..eager import eager
from ..spec import STAGES, stream_key
from ..workspace import Workspace
from .arrays import accepts_arrays
from .hierarchical import NodePlan, gather_decode
from .inputs import check_disjoint, check_tensor
from .plan import cached_plan
from .rounds import checked

_steps: "weakref.WeakKeyDictionary[Communicator, int]" = weakref.WeakKeyDictionary()
BIRDER_STAGES = ("node", "inter", "server")
"""Birder's three binarizations (``spec.STAGES``), in the order of a call's stream keys (``BirderPlan.finish``)."""


@eager
@accepts_arrays
def hierarchical_allreduce(
    tensor: torch.Tensor,
    comm: Communicator | None = None,
    *,
    ranks_per_node: int | str | None = "auto",
    seed: int = 0,
    step: int | None = None,
    out: torch.Tensor | None = None,
    async_op: bool = False,
) -> torch.Tensor | Work:
    """Unbiased 1-bit estimate of the average of ``tensor`` over all ranks, Birder style.

    n = N nodes x k ranks, Np = padded_numel(numel, n); local rank j owns shard j
    (Np / k elements), made of N sub-chunks of Np / n. Every quantization is Birder's
    binary randomization (docs/architecture.md, "Exact numerics") with a max-abs scale
    per row, so each is unbiased and the result is too; there is no error feedback.
    1. One small allgather of (numel, shape, ranks_per_node, finite?) over ``comm``: all
       ranks agree or all raise. The node layout is discovered on first use, then reused.
    2. Every rank binarizes its padded tensor, one scale per shard; intra-node
       all-to-all: local rank j receives its k peers' shard j and averages them.
    3. Local rank j binarizes that average, one scale per sub-chunk; inter-node
       all-to-all among the local ranks j of all nodes: each receives one sub-chunk from
       every node and averages them.
    4. It binarizes its sub-chunk average (one scale); inter-node all-gather, then
       intra-node all-gather of the 1-bit rows; every rank decodes the same n rows.
    Bytes per rank: intra (k-1) Np/(8k) + (k-1) Np/(8k); inter 2(N-1)/N Np/(8k), which is
    1/k of the flat gather-scatter's inter-node bytes (plus 4 bytes per row and 32 per
    rank of metadata).

    Randomness is counter-based: element i of a stage draws from (seed, step, stage,
    rank, i), so CPU and GPU give the same bits and a run is reproduced from its seed.

    Args:
        tensor: any shape, float32 / float16 / bfloat16, on the CPU or a CUDA device; not modified.
            A numpy or cupy array (anything that exports DLPack) works too, without a copy;
            the result is then an array of its library (``arrays.accepts_arrays``).
        comm: the communicator; None means ``compcoll.get_default()``.
        ranks_per_node: k consecutive ranks form a node; "auto" (default; None too)
            discovers the nodes from hostnames (or ``COMPCOLL_RANKS_PER_NODE``). Every rank must pass the same.
        seed: the random seed; every call with the same seed and step draws the same bits.
        step: the call counter mixed into the randomness; None takes the communicator's
            own counter, which advances on every such call, so every call draws fresh bits.
        out: where to write the result (may be ``tensor`` itself; no other memory of the call's
            arguments: ValueError); None allocates it.
        async_op: return a ``Work`` at once (as ``compressed_allreduce``).

    Returns:
        The estimate of the average, shaped and typed like ``tensor``, bit-identical on
        every rank (or its Work, with ``async_op``).

    Raises:
        TypeError / ValueError: bad input or option, on the rank that passed it (the
            other ranks raise ``RemoteError``, as for ``compressed_allreduce``); a layout
            whose nodes differ in size (on every rank).
        RankMismatchError: ranks disagree on size, shape or ranks_per_node.
        NonFiniteError: NaN / Inf in some rank's tensor (no buffer changed).
        CollectiveTimeout: a peer did not join within ``comm.timeout`` seconds.
    """
    what = "hierarchical_allreduce"
    comm = communicator(comm, "hierarchical_allreduce")

    def checks() -> int:
        check_tensor(what, tensor, out, comm.carries_meta)
        check_disjoint(what, (("tensor", tensor), ("out", out)))
        if step is not None and (isinstance(step, bool) or not isinstance(step, int) or step < 0):
            raise ValueError(f"{what}: step must be a non-negative integer or None, got {step!r}")
        return requested_ranks_per_node(ranks_per_node)

    requested = checked(comm, what, checks)
    plan = cached_plan(comm, (BirderPlan, tensor.numel(), tensor.device, requested, ranks_per_node),
                       lambda: BirderPlan(comm, tensor.numel(), tensor.device, requested, ranks_per_node))
    return plan.start(tensor, out, async_op, seed=seed, step=step)


class BirderPlan(NodePlan):
    """``hierarchical_allreduce`` on tensors of ``numel`` elements: agreement, node layout, scratch."""

    what = "hierarchical_allreduce"

    def _run(self, tensor: torch.Tensor, errors: tuple[torch.Tensor, ...], result: torch.Tensor, *,
             seed: int = 0, step: int | None = None) -> torch.Tensor:
        """Steps 1-4 of ``hierarchical_allreduce`` on checked arguments, in this rank's turn: the row maxima and the
        agreement (the call's one host wait), this call's three random streams' keys on the device, then
        ``finish`` (replayed on a device: ``Replays``)."""
        comm, ws = self.comm, self.workspace
        maxima = ws.get("maxima", comm.size, torch.float32, self.device)
        self.agreed(self.agreement(tensor), "maxima", _maxima_into, tensor, maxima, self.full)
        if step is None:
            step = _steps.get(comm, 0)
            _steps[comm] = step + 1
        if self.numel == 0:
            return result
        keys = codecs.stream_keys([stream_key(seed, step, STAGES[stage], comm.rank) for stage in BIRDER_STAGES],
                                  ws.get("keys", len(BIRDER_STAGES), torch.int64, self.device),
                                  ws.get("keys.host", len(BIRDER_STAGES), torch.int64, torch.device("cpu")))
        return self.replays.run("finish", self.finish, tensor, maxima, keys, result)

    def finish(self, tensor: torch.Tensor, maxima: torch.Tensor, keys: torch.Tensor, result: torch.Tensor
               ) -> torch.Tensor:
        """Steps 2-4 of ``hierarchical_allreduce`` once the ranks agreed, with the row ``maxima`` and the stages'
        stream ``keys`` (``BIRDER_STAGES``' order) on the device.

        1. Intra-node exchange of the binarized shards (scales: each node's largest row maximum).
        2. Inter-node exchange of the binarized node averages.
        3. The server row binarized, all-gathered between nodes, then within the node, and every row decoded into
           ``result``.
        Kernels, the wire and torch operators into workspace buffers, reading no host value: no host wait.
        """
        n, full, ws, layout = self.comm.size, self.full, self.workspace, self.layout
        k, nodes = layout.ranks_per_node, layout.nodes
        shard, sub = full // k, full // n
        base = layout.local_rank * shard
        node_scales = torch.amax(maxima.view(k, nodes), dim=1,
                                 out=ws.get("node.scales", k, torch.float32, self.device))
        shard_average = _binarize_exchange(tensor, node_scales, layout.intra, keys[0:1], 0, shard, ws, "node")
        sub_average = _binarize_exchange(
            shard_average, codecs.row_absmax(shard_average, nodes, shard,
                                             ws.get("inter.scales", nodes, torch.float32, self.device)), layout.inter,
            keys[1:2], base, sub, ws, "inter",
        )
        row = ws.get("server", codecs.SCALE_BYTES + sub // 8, torch.uint8, self.device)
        own_scale = codecs.row_absmax(sub_average, 1, sub, ws.get("server.scale", 1, torch.float32, self.device))
        codecs.randomized_encode(sub_average, own_scale, keys[2:3], base + layout.inter.rank * sub, row.view(1, -1))
        shard_rows = ws.get("shard_rows", nodes * row.numel(), torch.uint8, self.device)
        layout.inter.allgather(row, shard_rows)
        gather_decode(shard_rows, layout, result, ws)
        return result


def _maxima_into(tensor: torch.Tensor, maxima: torch.Tensor, length: int, total: torch.Tensor) -> torch.Tensor:
    """maxima <- the largest |x| of each of the ``maxima.numel()`` rows of ``tensor`` zero-padded to ``length``
    (``codecs.row_absmax``), and total[0] <- 0.0 where they are all finite, else NaN (on a device in the same
    launch), with no host wait; returns ``total``: Birder's device part before its agreement (``Plan.agreed``)."""
    codecs.row_absmax(tensor, maxima.numel(), length, maxima, finite=total)
    return total


def _binarize_exchange(
    source: torch.Tensor, scales: torch.Tensor, group: Communicator, key: torch.Tensor, start: int, length: int,
    workspace: Workspace, name: str,
) -> torch.Tensor:
    """Binarize ``source`` into ``group.size`` framed rows, all-to-all them, average what comes back.

    1. Row r (``length`` elements, scale scales[r]) is binarized with the random stream ``key`` (one int64 of
       ``codecs.stream_keys``), element i drawing index start + i, and framed.
    2. All-to-all: rank r of ``group`` receives row r of every member.
    3. The received rows are decoded and averaged with weights float32(s / size), in
       member order, the weights read from the frame heads as it adds (``codecs.accumulate_framed``).

    Returns the float32 average (a buffer of ``workspace`` named ``name``).
    """
    size = group.size
    width = codecs.SCALE_BYTES + length // 8
    wire = workspace.get(name + ".send", size * width, torch.uint8, source.device).view(size, width)
    codecs.randomized_encode(source, scales, key, start, wire)
    received = workspace.get(name + ".recv", size * width, torch.uint8, source.device)
    group.alltoall(wire.view(-1), received)
    average = workspace.get(name + ".average", length, torch.float32, source.device)
    codecs.accumulate_framed(received.view(size, width), 0, size, 0, None, average, length,
                             weights=workspace.get(name + ".weights", size, torch.float32, source.device))
    return average
