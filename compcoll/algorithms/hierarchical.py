"""The error-compensated hierarchical 1-bit allreduce, and the node plan Birder's form shares (docs/architecture.md)."""

from __future__ import annotations

import functools

import torch

from .. import codecs
from ..comm import Communicator, communicator
from ..comm.topology import Topology, requested_ranks_per_node, topology
from ..comm.work import Work
from ..eager import eager
from ..spec import PROTOCOLS, SCALES, check_block_size, padded_numel
from ..workspace import Workspace
from .agreement import Option, Step
from .arrays import accepts_arrays
from .exact import shard_average
from .inputs import check_disjoint, check_error_buffer, check_length, check_protocol, check_scale, check_tensor
from .plan import Plan, cached_plan
from .reduce_scatter import agreed_statistics, float32_target
from .rounds import checked
from .server import device_scalars, encode_worker, serve, serve_blocks, sum_into, sums_scalars


def hierarchical_error_numels(numel: int, world_size: int, ranks_per_node: int) -> tuple[int, int]:
    """Lengths of the (worker, server) error buffers of ``hierarchical_compressed_allreduce``.

    With Np = padded_numel(numel, world_size): the worker error covers one shard, Np / k;
    the server error one sub-chunk, Np / world_size.
    """
    if ranks_per_node < 1 or world_size % ranks_per_node:
        raise ValueError(f"ranks_per_node={ranks_per_node} does not divide world_size={world_size}")
    full = padded_numel(numel, world_size)
    return full // ranks_per_node, full // world_size


class NodePlan(Plan):
    """A plan whose layout needs the node layout (``topology``), resolved at its first call."""

    def __init__(self, comm: Communicator, numel: int, device: torch.device, requested: int,
                 ranks_per_node: int | str | None, options: tuple[Option, ...] = ()) -> None:
        super().__init__(comm, numel, device, (Option("ranks_per_node", requested), *options))
        self.ranks_per_node = ranks_per_node
        self._layout: Topology | None = None

    @property
    def layout(self) -> Topology:
        """The node layout (a collective the first time: call it in every rank's turn)."""
        if self._layout is None:
            self._layout = topology(self.comm, self.ranks_per_node)
        return self._layout


def gather_decode(shard_rows: torch.Tensor, layout: Topology, out: torch.Tensor, workspace: Workspace) -> None:
    """Intra-node all-gather of every local rank's shard rows; decode all n rows into ``out``."""
    n = layout.ranks_per_node * layout.nodes
    gathered = workspace.get("all_rows", layout.ranks_per_node * shard_rows.numel(), torch.uint8, out.device)
    layout.intra.allgather(shard_rows, gathered)
    codecs.decode_framed(gathered.view(n, -1), out)


@eager
@accepts_arrays
def hierarchical_compressed_allreduce(
    tensor: torch.Tensor,
    worker_error: torch.Tensor,
    server_error: torch.Tensor,
    comm: Communicator | None = None,
    *,
    ranks_per_node: int | str | None = "auto",
    out: torch.Tensor | None = None,
    async_op: bool = False,
    scale: str = "l2",
    block_size: int | None = None,
    protocol: str = "gather_scatter",
) -> torch.Tensor | Work:
    """Error-compensated 1-bit allreduce with an uncompressed intra-node stage, for 1-bit Adam.

    n = N nodes x k ranks, Np = padded_numel(numel, n); local rank j owns shard j.
    1. One small allgather of (numel, shape, ranks_per_node, buffer lengths): all ranks
       agree or all raise; then the node layout (built once) and the buffer lengths.
    2. Intra-node reduce-scatter in float32 (all-to-all of shards, summed in local-rank
       order, divided by k): local rank j holds its node's average of shard j.
    3. The ``scale``'s sum (of squares, or of |x|) of that average + worker_error; one
       small allgather of (finite?, worker scale) over ``comm``, so all ranks raise alike
       on NaN / Inf.
    4. Between nodes, the local ranks j run the gather-scatter protocol of
       ``compressed_allreduce`` on shard j with their own error buffers.
    5. Intra-node all-gather of the 1-bit server rows; every rank decodes all n rows.
    The mean of the node averages is the global average, so this estimates what the
    flat ``compressed_allreduce`` does, with inter-node bytes 2(N-1)/N Np/(8k) per rank,
    1/k of the flat algorithm's.
    With ``protocol="allgather"``, steps 4-5 compress once (``_allgather_between_nodes``):
    4'. The local ranks j all-gather their packed shard j between nodes ((N-1) Np/(8k)
        bytes per rank: at 2 nodes what gather-scatter sends, and more from 3 on).
    5'. Intra-node all-gather of those N rows per shard; every rank averages each shard's
        N rows (weights float32(s_i / N), in the order of the ranks) into the result.

    Args:
        tensor: any shape, float32 / float16 / bfloat16, on the CPU or a CUDA device; not modified.
            A numpy or cupy array (anything that exports DLPack) works too, without a copy;
            the result is then an array of its library (``arrays.accepts_arrays``).
        worker_error: float32, 1-D, Np / k elements (``hierarchical_error_numels``);
            updated in place.
        server_error: float32, 1-D, Np / n elements; updated in place.
        comm: the communicator; None means ``compcoll.get_default()``.
        ranks_per_node: as for ``hierarchical_allreduce``.
        out: where to write the result (may be ``tensor`` itself; no other memory of the call's
            arguments: ValueError); None allocates it.
        async_op: return a ``Work`` at once (as ``compressed_allreduce``).
        scale: "l2" (default) or "l1", as in ``compressed_allreduce``; every rank the same.
        block_size: None (default) or elements per scale block, as in
            ``compressed_allreduce``: the inter-node gather-scatter (step 3) takes one coded
            scale per block (``server.serve_blocks``).
        protocol: "gather_scatter" (default) or "allgather" between nodes (steps 4'-5'; one scale per shard:
            no ``block_size``); ``server_error`` is then not used.

    Returns:
        The estimate of the average, shaped and typed like ``tensor``, bit-identical on
        every rank.

    Raises:
        ValueError: a wrong buffer length, an unknown ``protocol``, or "allgather" with a ``block_size``, on every
            rank (and what ``hierarchical_allreduce`` raises).
        RankMismatchError: the ranks' lengths differ.
    """
    what = "hierarchical_compressed_allreduce"
    comm = communicator(comm, "hierarchical_compressed_allreduce")

    def checks() -> int:
        check_tensor(what, tensor, out, comm.carries_meta)
        for name, buf in (("worker_error", worker_error), ("server_error", server_error)):
            check_error_buffer(what, name, buf, tensor)
        check_disjoint(what, (("tensor", tensor), ("out", out), ("worker_error", worker_error),
                              ("server_error", server_error)))
        check_scale(what, scale)
        check_block_size(what, block_size)
        check_protocol(what, protocol)
        if protocol == "allgather" and block_size is not None:
            raise ValueError(f"{what}: the allgather protocol sends one scale per shard; block_size={block_size} needs "
                             "protocol='gather_scatter'")
        return requested_ranks_per_node(ranks_per_node)

    requested = checked(comm, what, checks)
    lengths = (worker_error.numel(), server_error.numel())
    plan = cached_plan(comm, (CompensatedPlan, tensor.numel(), tensor.device, requested, ranks_per_node, lengths, scale,
                              block_size, protocol),
                       lambda: CompensatedPlan(comm, tensor.numel(), tensor.device, requested, ranks_per_node, lengths,
                                               scale, block_size, protocol))
    return plan.start(tensor, out, async_op, (worker_error, server_error))


class CompensatedPlan(NodePlan):
    """``hierarchical_compressed_allreduce`` on tensors of ``numel`` elements, error buffers of ``lengths``.

    Layout: local rank j's worker error covers shard j (Np / k elements from j * Np / k),
    its server error the sub-chunk of that shard it serves between nodes (unused by the allgather protocol).
    """

    what = "hierarchical_compressed_allreduce"

    def __init__(self, comm: Communicator, numel: int, device: torch.device, requested: int,
                 ranks_per_node: int | str | None, lengths: tuple[int, int], scale: str = "l2",
                 block_size: int | None = None, protocol: str = "gather_scatter") -> None:
        super().__init__(comm, numel, device, requested, ranks_per_node, (
            Option("worker_error lengths", lengths[0]),
            Option("server_error lengths", lengths[1]),
            Option("scales", list(SCALES).index(scale), tuple(SCALES)),
            Option("block sizes", block_size or 0, ("one scale per chunk",)),
            Option("protocols", PROTOCOLS.index(protocol), PROTOCOLS),
        ))
        self.scale = scale
        self.block_size = block_size
        self.protocol = protocol

    @functools.cached_property
    def shard_senders(self) -> list[int]:
        """The ranks whose packed shards the allgather protocol averages, shard by shard: for each local rank j,
        the ranks of local rank j on every node in the order of their ranks (the order of that local rank's
        ``inter``). Worked out once, at the first allgather call (the layout is known by then)."""
        layout = self.layout
        members: list[list[int]] = [[] for _ in range(layout.nodes)]
        for rank, node in enumerate(layout.node_of):
            members[node].append(rank)
        return [rank for j in range(layout.ranks_per_node) for rank in sorted(node[j] for node in members)]

    @functools.cached_property
    def senders(self) -> list[int]:
        """The ranks whose weights the server takes, in its order: ``shard_senders`` for the allgather protocol,
        this rank's inter group for gather-scatter. Worked out once, at the first call (the layout is known by
        then)."""
        return self.shard_senders if self.protocol == "allgather" else list(self.layout.inter_ranks)

    def error_layout(self) -> tuple[tuple[int, int], tuple[int, int]]:
        layout = self.layout
        worker, server = hierarchical_error_numels(self.numel, self.comm.size, layout.ranks_per_node)
        worker_start = layout.local_rank * worker
        return (worker, worker_start), (server, worker_start + layout.inter.rank * server)

    def _run(self, tensor: torch.Tensor, errors: tuple[torch.Tensor, ...], result: torch.Tensor,
             step: Step | None = None) -> torch.Tensor:
        """Steps 1-5 of ``hierarchical_compressed_allreduce`` on locally checked arguments, in this rank's turn; the
        agreement checks the caller's ``step`` where given (``Agreement.check``)."""
        what, comm, ws = self.what, self.comm, self.workspace
        agreement = self.agreement(tensor)
        agreement.check_signatures(self.device, step)
        layout = self.layout
        worker_error, server_error = errors or self.error_feedback.buffers()
        n, k, nodes = comm.size, layout.ranks_per_node, layout.nodes
        numel = self.numel
        b = self.block_size
        shard, sub = hierarchical_error_numels(numel, n, k)
        if (worker_error.numel(), server_error.numel()) != (shard, sub):
            hint = (f"; they depend on the node layout, here {k} rank(s) per node: size them with "
                    f"hierarchical_error_numels({numel}, {n}, {k}), or pass the ranks_per_node they were sized for")
            check_length(what, "worker_error", worker_error, shard, f"padded_numel({numel}, {n}) // {k}{hint}")
            check_length(what, "server_error", server_error, sub, f"padded_numel({numel}, {n}) // {n}{hint}")
        if numel == 0:
            return result

        average = shard_average(tensor, layout.intra, shard, ws, "node")
        if b is not None:
            sums = agreed_statistics(self, agreement, average, worker_error, b, self.scale, 1, layout.nodes)
            return self.replays.run("finish_blocks", self.finish_blocks, average, worker_error, server_error, sums,
                                    result)
        on_device = agreement.on_device()
        scale, scales = self.agreed(agreement, "sum", sum_into, average, worker_error, self.scale,
                                    scale=(shard, self.scale), host_scales=not on_device)
        if on_device:
            scalars = sums_scalars(agreement, self.senders, nodes, self.device, ws)
        else:
            scalars = device_scalars(scales.numpy()[self.senders], nodes, scale, self.device, ws)
        return self.replays.run("finish_flat", self.finish_flat, average, worker_error, server_error, scalars, result)

    def finish_flat(self, average: torch.Tensor, worker_error: torch.Tensor, server_error: torch.Tensor,
                    scalars: tuple, result: torch.Tensor) -> torch.Tensor:
        """Steps 3-5 with one scale, once the ranks agreed: encode the node's ``average`` with this rank's s_w read
        from the device (``encode_worker``: ``scalars`` the weights and s_w, or, over NCCL's round, where the round
        left every rank's sum: the encode derives s_w and the weights of ``senders``), then serve between nodes and
        gather within the node (``gather_decode``), or the allgather protocol's exchange
        (``_allgather_between_nodes``). Kernels and the wire only, into workspace buffers: the device part a plan
        replays (``replay.Replays``)."""
        layout, ws = self.layout, self.workspace
        bits = ws.get("bits", average.numel() // 8, torch.uint8, self.device)
        weights = encode_worker(average, worker_error, scalars, self.comm.rank, self.scale, bits)
        if self.protocol == "allgather":
            return _allgather_between_nodes(bits, weights, layout, self.numel, result, ws)
        gather_decode(serve(bits, weights, server_error, layout.inter, ws, self.scale).view(-1), layout, result, ws)
        return result

    def finish_blocks(self, average: torch.Tensor, worker_error: torch.Tensor, server_error: torch.Tensor,
                      sums: torch.Tensor, result: torch.Tensor) -> torch.Tensor:
        """Steps 3-5 with block scales, once the ranks agreed on the block ``sums``: serve between nodes
        (``server.serve_blocks``), gather the rows within the node and decode them. Kernels and the wire only: the
        device part a plan replays."""
        layout, ws, b = self.layout, self.workspace, self.block_size
        rows = serve_blocks(average, worker_error, server_error, sums, layout.inter, ws, b, self.scale)
        gathered = ws.get("all_rows", layout.ranks_per_node * rows.numel(), torch.uint8, self.device)
        layout.intra.allgather(rows.view(-1), gathered)
        codecs.decode_framed_blocks(gathered.view(self.comm.size, -1), -(-server_error.numel() // b), b, result)
        return result


def _allgather_between_nodes(bits: torch.Tensor, weights: torch.Tensor, layout: Topology, numel: int,
                             result: torch.Tensor, workspace: Workspace) -> torch.Tensor:
    """Steps 4'-5' of ``hierarchical_compressed_allreduce``: the N nodes' packed shard j meet at local rank j, every
    shard's N rows meet on every rank, and each shard is their average.

    1. All-gather ``bits`` (this rank's packed shard) over ``inter``: N rows, in the order of the ranks.
    2. All-gather those rows over ``intra``: k x N rows, local rank j's in place j.
    3. Shard j of the result (up to ``numel``) <- sum_i weights[j, i] * signs(row j, i), every shard in one kernel
       (``codecs.accumulate_groups``, weights (k, N) in ``CompensatedPlan.shard_senders``' order), in float32
       (scratch for a 16-bit ``result``).
    """
    k, nodes = layout.ranks_per_node, layout.nodes
    rows = workspace.get("inter.rows", nodes * bits.numel(), torch.uint8, bits.device)
    layout.inter.allgather(bits, rows)
    every = workspace.get("all_rows", k * rows.numel(), torch.uint8, bits.device)
    layout.intra.allgather(rows, every)
    target = float32_target(result, numel, workspace)
    codecs.accumulate_groups(every.view(k * nodes, -1), weights.view(k, nodes), target, numel)
    if result.dtype != torch.float32:
        result.view(-1).copy_(target)
    return result
