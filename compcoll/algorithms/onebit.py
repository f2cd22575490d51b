"""Error-compensated 1-bit allreduce, written once against Communicator + codecs (docs/architecture.md)."""

from __future__ import annotations

import torch

from .. import codecs
from ..comm import Communicator, communicator
from ..comm.work import Work
from ..eager import eager
from ..spec import LEVEL_BITS, PROTOCOLS, SCALE_BYTES, SCALES, check_block_size, padded_numel
from .agreement import Option, Step
from .arrays import accepts_arrays
from .inputs import (check_disjoint, check_error_buffer, check_length, check_levels, check_protocol, check_scale,
                     check_tensor)
from .pipeline import agree_pieces, serve_in_pieces
from .plan import Plan, cached_plan
from .reduce_scatter import agreed_statistics, float32_target
from .rounds import checked
from .server import device_scalars, encode_worker, serve, serve_blocks, serve_levels, sum_into, sums_scalars


@eager
@accepts_arrays
def compressed_allreduce(
    tensor: torch.Tensor,
    worker_error: torch.Tensor,
    server_error: torch.Tensor,
    comm: Communicator | None = None,
    *,
    protocol: str = "gather_scatter",
    out: torch.Tensor | None = None,
    async_op: bool = False,
    pieces: int | None = None,
    scale: str = "l2",
    block_size: int | None = None,
    bits: int = 1,
) -> torch.Tensor | Work:
    """Average ``tensor`` over all ranks with 1-bit compression and error feedback.

    Gather-scatter protocol (the seed's, DeepSpeed-compatible numerics), n ranks,
    Np = padded_numel(numel, n), x = flat float32 tensor zero-padded to Np:
    1. x += worker_error; s_w = ||x||_2 / sqrt(Np) (``scale="l2"``) or ||x||_1 / Np
       (``scale="l1"``) (one read-only pass, float64 sum).
    2. One small allgather of (numel, shape, options, finite?, s_w): every rank checks
       that all ranks agree and that all s_w are finite, and all raise the same error if
       not, before any buffer is written.
    3. q = sign(x) (sign(0) = +1) packed to Np/8 bytes; worker_error = x - s_w * q
       (one fused pass).
    4. All-to-all of packed chunks: rank r receives chunk r of every rank.
    5. Rank r serves chunk r: c = sum_i (s_w[i]/n) * q_i + server_error;
       s_s = the same scale of c over Np/n; server_error = c - s_s * sign(c); pack sign(c).
    6. All-gather of (s_s, packed server chunk); every rank decodes the same bytes, so
       every rank returns the same bits.
    Large tensors run steps 3-6 in pieces, the encoding and decoding of one piece
    overlapping the exchange of another, with the same bits (``pieces``).
    Bytes sent per rank: 2(n-1)/n * Np/8 + 4(n-1) + 48(n-1) of metadata; a float32 ring
    allreduce sends 2(n-1)/n * 4 * numel, 32x more. The first call of each size whose pieces
    are left to compcoll sends 24(n-1) more (``pipeline.agree_pieces``).

    With ``block_size`` B every compression (steps 1, 3 and 5) takes one scale per block of B
    elements instead of one per vector or chunk: blocks start at each chunk's start (the whole
    vector's for allgather), the last one of a chunk shorter where B does not divide it; the
    scale of a block is the same formula over its elements (``codecs.block_sums``, ``spec.block_scales_from``), each
    block's float64 sum taken sequentially. The agreement carries no scale. Each packed chunk travels
    behind its largest block scale (float32) and one 8-bit code per block: the chunk's largest
    scale times 2^(-k/8), or 0 (``spec.code_scales``: the nearest of 255 values over 32
    octaves, within 4.4%); every rank, the encoder included, uses the decoded scale, so the
    error buffers absorb the rounding. That is 1 byte per B elements (B = 64: +12.5% bytes
    over one bit each). The server weighs rank i's block b by s_w[i, b] / n. The call runs
    in one piece.

    With ``bits`` of 2 to 8 (gather-scatter with ``block_size`` only) both compressions send
    uniform levels instead of signs (``reference.compress_levels``: a step per block over its
    largest value, the nearest level, bit planes): step 1 takes each block's largest |x|, the
    server adds the received levels (float32(level * step_i / n), rank by rank) and compresses
    its chunk plus its server error the same way, and every rank decodes each served chunk's
    levels. Bytes: ``bits`` times the signs' (plus the same scale codes).

    The allgather protocol instead all-gathers every rank's whole packed vector
    ((n-1) * Np/8 bytes per rank, one round fewer) and returns the exact average of the
    n worker estimates; ``server_error`` is not used. It sends no more than
    gather-scatter at n = 2 and is more precise there.

    Args:
        tensor: any shape, float32 / float16 / bfloat16, on the CPU or a CUDA device; not modified.
            A numpy or cupy array (anything that exports DLPack) works too, without a copy;
            the result is then an array of its library (``arrays.accepts_arrays``).
        worker_error: float32, 1-D, length Np, same device; updated in place.
        server_error: float32, 1-D, length Np // n, same device; updated in place.
        comm: the communicator; None means ``compcoll.get_default()``.
        protocol: "gather_scatter" (default) or "allgather".
        out: where to write the result (same shape, dtype and device as ``tensor``; it
            may be ``tensor`` itself for an in-place allreduce); None allocates it.
            Otherwise no two of ``tensor``, ``worker_error``, ``server_error`` and ``out``
            may share memory (ValueError names the pair: the call would write one while it
            reads another).
        async_op: return a ``Work`` at once instead of the result; the call runs on the
            communicator's ordering thread (see ``launch``), its ``wait()`` returns the
            result or raises the errors below, and ``get_future()`` yields the result.
            Leave ``tensor``, the buffers and ``out`` alone until then.
        pieces: gather-scatter only: exchange the chunks in this many pieces, so that
            encoding and decoding overlap the wire (``pipeline.serve_in_pieces``); the
            result is the same bits. None lets compcoll pick, alike on every rank, at the
            first call of each size (``pipeline.agree_pieces``): 1 when all ranks share a
            node or on CUDA, else one per 8 MiB. Every rank must pass the same.
        scale: "l2" (default; DeepSpeed's ||x||_2 / sqrt(d)) or "l1" (mean |x|, the s that
            minimises ||x - s sign(x)||_2, so each call's compression error is smallest).
            Every rank must use the same.
        block_size: None (default: one scale per vector, and per server chunk) or a power
            of two from 8 to 8192: one scale per block of that many elements, for both
            protocols (see above). Every rank must use the same. Not with ``pieces`` > 1.
        bits: 1 (default: signs) or 2, 3, 4, 8 (uniform levels; gather-scatter with ``block_size``
            only). Every rank must use the same.

    Returns:
        The estimate of the average over ranks, shaped and typed like ``tensor``,
        bit-identical on every rank (or its Work, with ``async_op``).

    Raises:
        TypeError / ValueError: bad dtype, device, buffer length or option, on the rank
            that passed it, from the call itself (also with ``async_op``), after one
            fixed-size exchange that tells the other ranks (``rounds.refuse``).
        RemoteError: another rank's arguments were bad (on every other rank; nothing
            changed, the communicator still usable).
        RankMismatchError: ranks disagree on size, shape, protocol, pieces or scale (on every rank).
        NonFiniteError: NaN/Inf in tensor + worker_error on some rank (on every rank;
            no buffer changed and the communicator stays usable).
        CollectiveTimeout: a peer did not join within ``comm.timeout`` seconds.
    """
    comm = communicator(comm, "compressed_allreduce")
    checked(comm, FlatPlan.what,
            lambda: _validate(tensor, worker_error, server_error, out, comm, protocol, pieces, scale, block_size, bits))
    plan = cached_plan(comm, (FlatPlan, tensor.numel(), tensor.device, protocol, pieces, scale, block_size, bits),
                       lambda: FlatPlan(comm, tensor.numel(), tensor.device, protocol, pieces, scale, block_size, bits))
    return plan.start(tensor, out, async_op, (worker_error, server_error))


class FlatPlan(Plan):
    """``compressed_allreduce`` on tensors of ``numel`` elements: layout, scratch, agreement, error feedback.

    Layout: Np = padded_numel(numel, n); the worker error covers the whole padded
    vector, the server error this rank's chunk of Np / n from rank * Np / n.

    Args:
        comm: the communicator.
        numel: the tensors' number of elements.
        device: the tensors' device.
        protocol: "gather_scatter" or "allgather".
        pieces: gather-scatter pieces (1: unpipelined; None: ``agree_pieces`` at the first call).
        scale: "l2" or "l1" (``spec.SCALES``).
        block_size: None (one scale per vector or chunk) or elements per scale block.
        bits: 1 (signs) or 2-8 (levels, with block_size).
    """

    what = "compressed_allreduce"

    def __init__(self, comm: Communicator, numel: int, device: torch.device, protocol: str = "gather_scatter",
                 pieces: int | None = None, scale: str = "l2", block_size: int | None = None, bits: int = 1) -> None:
        super().__init__(comm, numel, device,
                         (Option("protocols", PROTOCOLS.index(protocol), PROTOCOLS),
                          Option("pieces", pieces or 0, ("chosen by compcoll",)),
                          Option("scales", list(SCALES).index(scale), tuple(SCALES)),
                          Option("block sizes", block_size or 0, ("one scale per chunk",)),
                          Option("bits", LEVEL_BITS.index(bits), tuple(map(str, LEVEL_BITS)))))
        self.bits = bits
        self.protocol = protocol
        self.pieces = pieces
        self.scale = scale
        self.block_size = block_size
        self.chunk = self.full // comm.size

    def error_layout(self) -> tuple[tuple[int, int], tuple[int, int]]:
        return (self.full, 0), (self.chunk, self.comm.rank * self.chunk)

    def _run(self, tensor: torch.Tensor, errors: tuple[torch.Tensor, ...], result: torch.Tensor,
             step: Step | None = None) -> torch.Tensor:
        """Steps 1-6 of ``compressed_allreduce`` on checked arguments, in this rank's turn; the agreement checks the
        caller's ``step`` where given (``Agreement.check``)."""
        worker_error, server_error = errors or self.error_feedback.buffers()
        if self.block_size is not None:
            return self._run_blocks(tensor, worker_error, server_error, result, step)
        scale, scalars = self.agree_flat(tensor, worker_error, step)
        if self.numel == 0:
            return result
        if self.protocol == "gather_scatter" and self.pieces is None:
            self.pieces = agree_pieces(self.comm, tensor)
        if self.protocol == "gather_scatter" and self.pieces > 1:
            serve_in_pieces(tensor, worker_error, server_error, self.comm, scale, scalars[0], self.pieces, result,
                            self.workspace, self.scale)
            return result
        return self.replays.run("finish_flat", self.finish_flat, tensor, worker_error, server_error, scalars, result)

    def agree_flat(self, tensor: torch.Tensor, worker_error: torch.Tensor, step: Step | None = None
                   ) -> tuple[float | None, tuple]:
        """Steps 1-2 of a call with one scale: s_w from the compensated sum (the call's one host wait), the agreement,
        and what the encode and the server read on the device.

        1. Where the round ran on the device (NCCL's: ``Agreement.on_device``) and the call runs in one piece:
           every rank's sum stays where the round left it (``Agreement.device_sums``), and ``finish_flat``'s encode
           derives s_w and the server's weights s_i / n from it in its own launch (``compensate_encode_agreed``);
           the host judges the round and computes no scale (``host_scales``).
        2. Elsewhere (a round on the host, or a call in pieces, whose encodes take s_w from the host): the weights
           s_i / n with this rank's s_w copied to the device (``device_scalars``).

        Returns:
            s_w (None for 1: the device derives it), and what ``finish_flat`` takes: ``sums_scalars``'
            ``AgreedSums`` for 1 (the weights the view of the device buffer of 2 that the encode fills), (weights,
            s_w) views of the device buffer for 2.
        """
        agreement = self.agreement(tensor)
        on_device = agreement.on_device() and (self.protocol == "allgather" or self.pieces == 1)
        scale, scales = self.agreed(agreement, "sum", sum_into, tensor, worker_error, self.scale,
                                    scale=(self.full, self.scale), step=step, host_scales=not on_device)
        if on_device:
            return None, sums_scalars(agreement, range(self.comm.size), self.comm.size, self.device, self.workspace)
        return scale, device_scalars(scales.numpy(), self.comm.size, scale, self.device, self.workspace)

    def finish_flat(self, tensor: torch.Tensor, worker_error: torch.Tensor, server_error: torch.Tensor,
                    scalars: tuple, result: torch.Tensor) -> torch.Tensor:
        """Steps 3-6 of a call with one scale, in one piece, once the ranks agreed (``agree_flat``).

        1. Encode x = tensor + worker_error with s_w read from the device (``encode_worker``: from the agreed sums,
           with the server's weights beside it, where ``scalars`` holds them; else from ``device_scalars``' buffer).
        2. Gather-scatter: ``serve``, then decode every served chunk. Allgather: all-gather the
           packed vectors and average them (``_allgather_average``).
        Kernels and the wire only, into workspace buffers, reading no host value: no host wait, and on a steady
        call no allocation, so a CUDA graph can capture it where the transport can (``bench/gpu_graphs.py``).
        """
        bits = self.workspace.get("bits", self.full // 8, torch.uint8, self.device)
        weights = encode_worker(tensor, worker_error, scalars, self.comm.rank, self.scale, bits)
        if self.protocol == "allgather":
            return self._allgather_average(bits, weights, result)
        codecs.decode_framed(serve(bits, weights, server_error, self.comm, self.workspace, self.scale), result)
        return result

    def _run_blocks(self, tensor: torch.Tensor, worker_error: torch.Tensor, server_error: torch.Tensor,
                    result: torch.Tensor, step: Step | None = None) -> torch.Tensor:
        """Steps 1-6 with one scale per block of ``block_size`` elements, in one piece: ``agree_blocks``, then
        ``finish_blocks``."""
        sums = self.agree_blocks(tensor, worker_error, step)
        if self.numel == 0:
            return result
        return self.replays.run("finish_blocks", self.finish_blocks, tensor, worker_error, server_error, sums, result)

    def agree_blocks(self, tensor: torch.Tensor, worker_error: torch.Tensor, step: Step | None = None
                     ) -> torch.Tensor:
        """Step 1 of a call with block scales: block sums of |x|^p of x = tensor + worker_error (levels: block maxima
        of |x|) into the workspace, and the agreement (finite? on every rank): the call's one host wait.

        Returns:
            The statistics (a workspace buffer), which ``finish_blocks`` takes.
        """
        rows = self.comm.size if self.protocol == "gather_scatter" else 1
        return agreed_statistics(self, self.agreement(tensor), tensor, worker_error, self.block_size, self.scale,
                                 self.bits, rows, step)

    def finish_blocks(self, tensor: torch.Tensor, worker_error: torch.Tensor, server_error: torch.Tensor,
                      sums: torch.Tensor, result: torch.Tensor) -> torch.Tensor:
        """Steps 2-3 of a call with block scales, once the ranks agreed (``agree_blocks``).

        1. Gather-scatter: ``serve_blocks`` (levels: ``serve_levels``). Allgather: the block
           scales coded over the whole vector, encoded behind them; all-gather; every rank
           averages all ranks' rows (weights s_w[i, b] / n of the decoded scales).
        2. Decode: gather-scatter straight into the result, its scales rounded to its dtype
           (``codecs.decode_framed_blocks``); levels and allgather into float32 scratch first for
           a 16-bit result.
        Kernels and the wire only, into workspace buffers: no host wait, and on a steady call no allocation, so a
        CUDA graph can capture it where the transport can (``bench/gpu_graphs.py``).
        """
        comm, n, full, b, ws = self.comm, self.comm.size, self.full, self.block_size, self.workspace
        if self.bits > 1:
            served = serve_levels(tensor, worker_error, server_error, sums, comm, ws, b, self.bits)
            decoded = float32_target(result, self.numel, ws)
            blocks = -(-self.chunk // b)
            steps, planes = codecs.unframe_blocks(served, blocks, 1,
                                                  ws.get("levels.steps", n * blocks, torch.float32, self.device))
            codecs.decode_levels(planes, steps, b, self.bits, decoded, self.numel)
        elif self.protocol == "gather_scatter":
            served = serve_blocks(tensor, worker_error, server_error, sums, comm, ws, b, self.scale)
            codecs.decode_framed_blocks(served, -(-self.chunk // b), b, result)
            return result
        else:
            blocks = -(-full // b)
            width = SCALE_BYTES + blocks + full // 8
            send = ws.get("blocks.send", width, torch.uint8, self.device).view(1, width)
            scales, signs = codecs.frame_scales(send, sums, self.scale, b, full,
                                                ws.get("blocks.scales", blocks, torch.float32, self.device))
            codecs.encode_blocks(tensor, worker_error, scales.view(-1), b, signs)
            received = ws.get("blocks.received", n * width, torch.uint8, self.device)
            comm.allgather(send.view(-1), received)
            decoded = float32_target(result, full, ws)
            codecs.accumulate_framed(received.view(n, width), blocks, n, b, None, decoded, decoded.numel(),
                                     weights=ws.get("blocks.weights", n * blocks, torch.float32, self.device))
        if result.dtype != torch.float32:
            result.view(-1).copy_(decoded[:self.numel])
        return result

    def _allgather_average(self, bits: torch.Tensor, weights: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        """All-gather every rank's packed vector and average the decoded vectors."""
        n = self.comm.size
        gathered = self.workspace.get("all", n * bits.numel(), torch.uint8, self.device)
        self.comm.allgather(bits, gathered)
        flat = out.view(-1)
        average = flat if out.dtype == torch.float32 else self.workspace.get("avg", flat.numel(), torch.float32,
                                                                             self.device)
        codecs.accumulate_signs(gathered.view(n, -1), weights, None, average, flat.numel(), read=False)
        if average is not flat:
            flat.copy_(average)
        return out


def _validate(
    tensor: torch.Tensor,
    worker_error: torch.Tensor,
    server_error: torch.Tensor,
    out: torch.Tensor | None,
    comm: Communicator,
    protocol: str,
    pieces: int | None,
    scale: str,
    block_size: int | None = None,
    bits: int = 1,
) -> None:
    """Local checks, made before any communication."""
    what, n = "compressed_allreduce", comm.size
    check_tensor(what, tensor, out, comm.carries_meta)
    check_protocol(what, protocol)
    check_scale(what, scale)
    check_block_size(what, block_size)
    if pieces is not None and (isinstance(pieces, bool) or not isinstance(pieces, int) or pieces < 1):
        raise ValueError(f"{what}: pieces must be a positive integer or None, got {pieces!r}")
    if block_size is not None and pieces not in (None, 1):
        raise ValueError(f"{what}: a call with block_size runs in one piece; got pieces={pieces!r}")
    check_levels(what, bits, protocol, block_size)
    numel = tensor.numel()
    full = padded_numel(numel, n)
    for name, buf, length, formula in (
        ("worker_error", worker_error, full, f"padded_numel({numel}, {n})"),
        ("server_error", server_error, full // n, f"padded_numel({numel}, {n}) // {n}"),
    ):
        check_error_buffer(what, name, buf, tensor)
        check_length(what, name, buf, length, formula)
    check_disjoint(what, (("tensor", tensor), ("out", out), ("worker_error", worker_error),
                          ("server_error", server_error)))
