"""The gather-scatter exchange of ``compressed_allreduce`` in pieces, the kernels overlapping the wire, bit for bit."""

from __future__ import annotations

import torch

from .. import codecs
from ..comm import Communicator
from ..comm.topology import check_requests, host_id, request_code
from ..comm.work import Work
from ..spec import BLOCK, LANES, SCALE_BYTES
from ..workspace import Workspace

PIECE_BYTES = 8 << 20
"""Default input bytes per piece on the CPU: 8 MiB (a 64 MiB float32 tensor goes in 8 pieces)."""
MAX_PIECES = 16
PIECES_FIELDS = 3
"""int64s each rank sends in ``agree_pieces``: once per plan whose pieces are left to compcoll."""


def default_pieces(tensor: torch.Tensor) -> int:
    """Pieces for ``tensor`` by its size and device alone (``agree_pieces`` also asks where the ranks run).

    CPU: one per ``PIECE_BYTES`` of float32 input, at most ``MAX_PIECES``. CUDA (``codecs.on_host`` false): 1, since a
    numba-cuda launch costs about 0.1 ms from Python (bench/results/gpu_kernels_h100.txt),
    and pieces multiply the launches by the number of ranks.
    """
    if not codecs.on_host(tensor):
        return 1
    return max(1, min(MAX_PIECES, 4 * tensor.numel() // PIECE_BYTES))


def agree_pieces(comm: Communicator, tensor: torch.Tensor) -> int:
    """Pieces for a call that left them to compcoll, the same on every rank: one small allgather, once per plan.

    1. Every rank sends (``host_id()``, the ranks per node it was asked for by
       ``COMPCOLL_RANKS_PER_NODE`` (``topology.request_code``), ``default_pieces(tensor)``).
    2. A rank with a bad ``COMPCOLL_RANKS_PER_NODE``: ValueError on every rank (``topology.check_requests``).
    3. Every rank on one node (one hostname, and no rank asked for fewer ranks per node than
       the world has): 1. There the exchange is a memory copy by the same cores that run the
       kernels, so pieces hide nothing and cost their extra calls and synchronisations
       (2 ranks x 1 thread, 64 MiB: 8 pieces 81.0 ms against one 68.5 ms on Gloo,
       bench/results/local_pieces_gloo_2ranks.txt).
    4. Otherwise the smallest of the ranks' ``default_pieces``.
    Must run in the call's turn, after its agreement (every rank is in the same plan).
    """
    mine = torch.tensor([host_id(), request_code(None), default_pieces(tensor)], dtype=torch.int64)
    table = torch.empty(PIECES_FIELDS * comm.size, dtype=torch.int64)
    comm.allgather(mine, table)
    hosts, asked, wanted = table.view(comm.size, PIECES_FIELDS).t().tolist()
    check_requests(asked, "compressed_allreduce", None)
    if len(set(hosts)) == 1 and all(k == 0 or k >= comm.size for k in asked):
        return 1
    return min(wanted)


def piece_bounds(chunk: int, pieces: int) -> list[tuple[int, int]]:
    """Split a chunk of ``chunk`` elements into at most ``pieces`` pieces that start on BLOCK boundaries.

    Aligned pieces sum their squares in the blocks and lanes of the whole chunk, so their
    lane sums concatenate into the whole chunk's (see ``codecs.accumulate_lanes``).
    """
    step = max(1, -(-chunk // (BLOCK * pieces))) * BLOCK
    return [(a, min(a + step, chunk)) for a in range(0, chunk, step)] or [(0, 0)]


def _poke(works: list[Work]) -> None:
    """Let the transport progress the operations in flight (MPI progresses only inside its calls)."""
    for work in works:
        work.is_completed()


def serve_in_pieces(
    tensor: torch.Tensor,
    worker_error: torch.Tensor,
    server_error: torch.Tensor,
    comm: Communicator,
    scale: float,
    weights: torch.Tensor,
    pieces: int,
    result: torch.Tensor,
    workspace: Workspace,
    scale_kind: str = "l2",
) -> None:
    """Steps 3-6 of ``compressed_allreduce`` with every chunk cut into the same pieces.

    Bits and sums are those of the whole-tensor algorithm: the worker scale ``scale`` and
    the weights come from the whole tensor already, every kernel is elementwise, and the
    pieces start on BLOCK boundaries, so their lane sums (of |x|^p, ``scale_kind``) are the
    whole chunk's.
    1. For each piece p: encode piece p of every destination's chunk (worker error, scale
       ``scale``) and start the all-to-all of piece p; then wait for piece p-1 and add its
       signs into the server error (rank order, float32), keeping its lane sums.
    2. Server scale (``scale_kind``) from the tree sum of all the pieces' lane sums.
    3. For each piece p: encode piece p of the server chunk (its scale in front of piece 0)
       and start the all-gather of piece p; then wait for piece p-1 and decode it into
       ``result``.
    While a piece is on the wire the next one is encoded (or the previous one decoded),
    and each kernel call is followed by a poke at the operations in flight.
    """
    n = comm.size
    chunk = server_error.numel()
    flat, out = tensor.reshape(-1), result.view(-1)
    numel = flat.numel()
    bounds = piece_bounds(chunk, pieces)
    device = tensor.device

    lanes = workspace.get("pipe.lanes", max(1, -(-chunk // BLOCK)) * LANES, torch.float64, device)
    send = workspace.get("pipe.send", n * chunk // 8, torch.uint8, device)
    recv = workspace.get("pipe.recv", n * chunk // 8, torch.uint8, device)
    in_flight: list[tuple[Work, int, int]] = []
    for a, b in bounds:
        rows = send[n * a // 8:n * b // 8].view(n, (b - a) // 8)
        for r in range(n):
            lo, hi = r * chunk + a, r * chunk + b
            codecs.compensate_encode(flat[lo:max(lo, min(hi, numel))], worker_error[lo:hi], scale, rows[r])
            _poke([w for w, _, _ in in_flight])
        in_flight.append((comm.alltoall(rows.reshape(-1), recv[n * a // 8:n * b // 8], async_op=True), a, b))
        if len(in_flight) > 1:
            _accumulate(in_flight.pop(0), recv, weights, server_error, lanes, n, scale_kind)
    while in_flight:
        _accumulate(in_flight.pop(0), recv, weights, server_error, lanes, n, scale_kind)

    server_scale = codecs.tree_scale(lanes, chunk, scale_kind)
    own = workspace.get("pipe.own", SCALE_BYTES + chunk // 8, torch.uint8, device)
    own_bits = codecs.frame(own, server_scale)
    gathered = workspace.get("pipe.gathered", n * own.numel(), torch.uint8, device)
    scales: list[torch.Tensor] = []
    pending: list[tuple[Work, torch.Tensor, int, int]] = []
    for a, b in bounds:
        codecs.compensate_encode(None, server_error[a:b], server_scale, own_bits[a // 8:b // 8])
        lo = 0 if a == 0 else SCALE_BYTES + a // 8
        hi = SCALE_BYTES + b // 8
        rows = gathered[n * lo:n * hi].view(n, hi - lo)
        pending.append((comm.allgather(own[lo:hi], rows.reshape(-1), async_op=True), rows, a, b))
        if len(pending) > 1:
            _decode(pending.pop(0), scales, out, chunk, numel, n)
    while pending:
        _decode(pending.pop(0), scales, out, chunk, numel, n)


def _accumulate(piece: tuple[Work, int, int], recv: torch.Tensor, weights: torch.Tensor,
                server_error: torch.Tensor, lanes: torch.Tensor, n: int, scale_kind: str) -> None:
    """Wait for one piece's all-to-all; server_error[a:b] += sum_i weights[i] * signs_i, in rank
    order, and its lane sums of |x|^p into the piece's blocks of ``lanes``."""
    work, a, b = piece
    work.wait()
    rows = recv[n * a // 8:n * b // 8].view(n, (b - a) // 8)
    mine = lanes[a // BLOCK * LANES:a // BLOCK * LANES + codecs.lane_count(b - a)]
    errors = server_error[a:b]
    codecs.accumulate_lanes(rows, weights, errors, errors, b - a, mine, scale_kind)


def _decode(piece: tuple[Work, torch.Tensor, int, int], scales: list[torch.Tensor], out: torch.Tensor,
            chunk: int, numel: int, n: int) -> None:
    """Wait for one piece's all-gather and decode row r's piece into out[r * chunk + a : r * chunk + b] (cut at numel).

    The first piece carries every rank's server scale in front; it is kept in ``scales``.
    """
    work, rows, a, b = piece
    work.wait()
    if not scales:
        row_scales, rows = codecs.unframe(rows)
        scales.append(row_scales)
    for r in range(n):
        lo, hi = r * chunk + a, min(r * chunk + b, numel)
        if lo < hi:
            codecs.decode(rows[r:r + 1], scales[0][r:r + 1], out[lo:hi])
