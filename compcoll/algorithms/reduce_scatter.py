"""Error-compensated low-bit reduce-scatter: the first phase of gather-scatter (docs/architecture.md, "Algorithms")."""

from __future__ import annotations

from typing import Callable

import torch

from .. import codecs
from ..comm import Communicator, communicator
from ..comm.work import Work
from ..eager import eager
from ..spec import LEVEL_BITS, SCALE_BYTES, SCALES, check_bits, check_block_size
from ..workspace import Workspace
from .agreement import Agreement, Option, Step
from .arrays import accepts_arrays
from .inputs import check_disjoint, check_error_buffer, check_length, check_scale
from .plan import Plan, cached_plan
from .rounds import checked

OPS = ("avg", "sum", "premul_sum")
"""How the received rows combine: their average, their sum, or their sum each times a factor (FSDP2's ops)."""
BLOCK_SIZE = 64
"""Default elements per scale block."""


def row_elements(numel: int, n: int) -> int:
    """Elements of each wire row: the row's numel // n, rounded up to whole bytes of signs (a multiple of 8)."""
    return -(-(numel // n) // 8) * 8


@eager
@accepts_arrays
def compressed_reduce_scatter(
    tensor: torch.Tensor,
    out: torch.Tensor,
    worker_error: torch.Tensor,
    comm: Communicator | None = None,
    *,
    op: str = "avg",
    factor: float = 1.0,
    block_size: int = BLOCK_SIZE,
    scale: str = "l2",
    bits: int = 1,
    async_op: bool = False,
) -> torch.Tensor | Work:
    """Reduce-scatter ``tensor`` (n rows, row r for rank r) into ``out`` with low-bit compression and error feedback.

    n ranks, S = tensor.numel() / n, Sp = S rounded up to a multiple of 8 (``row_elements``),
    x = the (n, Sp) rows of ``tensor`` (zero-padded) + worker_error:
    1. Per block of ``block_size`` elements of each row (blocks restart at each row; the last
       one shorter): 1 bit, the float64 sum of |x|^p; 2-8 bits, the largest |x|.
    2. One small agreement: every rank checks that all ranks agree on size, dtype and
       options, and that every x is finite, and all raise the same error if not, before
       any buffer is written.
    3. Each block's scale (1 bit: ``scale``, the block's l2 or l1; 2-8 bits: the step of
       2^bits uniform levels spanning its largest, ``spec.level_step``) is coded against its
       row's largest as an 8-bit code (``spec.code_scales``); with s the decoded scale of an
       element's block: 1 bit, q = sign(x), value s * q; 2-8 bits, the nearest level c
       (``reference.level_codes``), value (c - (2^bits - 1)/2) * s; q packed (bit planes),
       worker_error = x - value (one fused pass).
    4. All-to-all of the framed rows (largest scale, codes, packed q): rank r receives row r
       of every rank.
    5. out = sum_i w_i * d_i in rank order (float32; d the sign or the centred level), w_i =
       the decoded scale of rank i's block: divided by n ("avg"), as it is ("sum"), times
       ``factor`` ("premul_sum", each product rounded to float32); then rounded to ``out``'s
       dtype.
    There is no second compression: ``out`` is the reduced shard itself. Bytes sent per
    rank: (n-1) rows of bits * Sp/8 + ceil(Sp/block_size) + 4, against 4(n-1)S for a float32
    reduce-scatter (1/28 at 1 bit and ``block_size`` 64; 1/10 at 3 bits), plus the agreement.

    Args:
        tensor: 1-D, n * S elements, float32 / float16 / bfloat16, CPU or CUDA; not modified.
        out: 1-D, S elements, same dtype and device; overwritten. It may lie inside ``tensor`` (its rank's row,
            as an in-place reduce-scatter: the call reads all of ``tensor`` before it writes ``out``), not inside
            ``worker_error`` (ValueError).
        worker_error: float32, 1-D, n * Sp elements, same device; updated in place.
        comm: the communicator; None means ``compcoll.get_default()``.
        op: "avg" (default), "sum" or "premul_sum". Every rank must pass the same.
        factor: the "premul_sum" multiplier. Every rank must pass the same.
        block_size: a power of two from 8 to 8192 (default 64). Every rank must pass the same.
        scale: 1 bit: "l2" (default) or "l1", as in ``compressed_allreduce``; levels ignore it.
        bits: bits per element, one of ``spec.LEVEL_BITS`` (1, 2, 3, 4, 8; default 1). Every rank
            must pass the same.
        async_op: return a ``Work`` at once (see ``compressed_allreduce``).

    Returns:
        ``out`` (or its Work).

    Raises:
        TypeError / ValueError: bad dtype, device, length or option, on the rank that passed it (the
            others get RemoteError).
        RankMismatchError: ranks disagree on size, dtype or options.
        NonFiniteError: NaN / Inf in x on some rank (on every rank; no buffer changed).
        CollectiveTimeout: a peer did not join within ``comm.timeout`` seconds.
    """
    comm = communicator(comm, "compressed_reduce_scatter")
    checked(comm, ScatterPlan.what,
            lambda: _validate(tensor, out, worker_error, comm, op, factor, block_size, scale, bits))
    key = (ScatterPlan, tensor.numel(), tensor.device, op, factor, block_size, scale, bits)
    plan = cached_plan(comm, key, lambda: ScatterPlan(comm, tensor.numel(), tensor.device, op, factor, block_size,
                                                      scale, bits))
    return plan.start(tensor, out, async_op, (worker_error,))


class ScatterPlan(Plan):
    """``compressed_reduce_scatter`` on inputs of ``numel`` elements: row layout, scratch, agreement.

    Args:
        comm: the communicator.
        numel: the inputs' number of elements (n * S).
        device: the inputs' device.
        op: "avg", "sum" or "premul_sum".
        factor: the "premul_sum" multiplier.
        block_size: elements per scale block.
        scale: "l2" or "l1".
        bits: bits per element.
    """

    what = "compressed_reduce_scatter"

    def __init__(self, comm: Communicator, numel: int, device: torch.device, op: str = "avg", factor: float = 1.0,
                 block_size: int = BLOCK_SIZE, scale: str = "l2", bits: int = 1) -> None:
        super().__init__(comm, numel, device,
                         (Option("ops", OPS.index(op), OPS),
                          Option("factors", int(torch.tensor(factor, dtype=torch.float32).view(torch.int32))),
                          Option("block sizes", block_size),
                          Option("scales", list(SCALES).index(scale), tuple(SCALES)),
                          Option("bits", LEVEL_BITS.index(bits), tuple(map(str, LEVEL_BITS)))))
        self.op, self.factor, self.block_size, self.scale, self.bits = op, factor, block_size, scale, bits
        self.row = numel // comm.size
        self.padded_row = row_elements(numel, comm.size)

    def error_layout(self) -> tuple[tuple[int, int], tuple[int, int]]:
        return (self.comm.size * self.padded_row, 0), (0, 0)

    def _rows(self, tensor: torch.Tensor) -> torch.Tensor:
        """``tensor`` as n rows of Sp elements: itself when S is a multiple of 8, else a zero-padded copy."""
        if self.row == self.padded_row:
            return tensor
        rows = self.workspace.get("rows", self.comm.size * self.padded_row, tensor.dtype, tensor.device)
        table = rows.view(self.comm.size, self.padded_row)
        table[:, self.row:].zero_()
        table[:, :self.row].copy_(tensor.view(self.comm.size, self.row))
        return rows

    def _run(self, tensor: torch.Tensor, errors: tuple[torch.Tensor, ...], result: torch.Tensor) -> torch.Tensor:
        """Steps 1-5 of ``compressed_reduce_scatter`` on checked arguments, in this rank's turn."""
        (worker_error,) = errors or (self.error_feedback.worker_error,)
        rows = self._rows(tensor)
        stats = agreed_statistics(self, self.agreement(tensor), rows, worker_error, self.block_size, self.scale,
                                  self.bits, self.comm.size)
        if self.numel == 0:
            return result
        return self.replays.run("finish", self.finish, rows, worker_error, stats, result)

    def finish(self, rows: torch.Tensor, worker_error: torch.Tensor, stats: torch.Tensor, result: torch.Tensor
               ) -> torch.Tensor:
        """Steps 3-5 once the ranks agreed on the block statistics ``stats``: ``scatter_rows`` into float32 (scratch
        for a 16-bit ``result``, copied into it). Kernels, the wire and in-place torch operators only, into workspace
        buffers: the device part a plan replays (``replay.Replays``)."""
        target = float32_target(result, self.row, self.workspace)
        scatter_rows(rows, worker_error, stats, self.comm, self.workspace, self.block_size, self.scale, self.bits,
                     self.comm.size if self.op == "avg" else 1, self._weigh if self.op == "premul_sum" else None,
                     target, self.row)
        if result.dtype != torch.float32:
            result.copy_(target)
        return result

    def _weigh(self, scales: torch.Tensor) -> torch.Tensor:
        """The received rows' weights of "premul_sum" from their decoded scales, in place: * factor ("avg"'s / n is
        the decode's own, ``scatter_rows``)."""
        return scales.mul_(codecs.device_scalar(scales, self.factor))


def float32_target(result: torch.Tensor, length: int, workspace: Workspace) -> torch.Tensor:
    """Where a blockwise call writes its float32 result: ``result`` itself (flat) when it is float32, else
    ``length`` elements of scratch, which the caller copies into ``result``."""
    if result.dtype == torch.float32:
        return result.view(-1)
    return workspace.get("blocks.decoded", length, torch.float32, result.device)


def statistics_into(rows: torch.Tensor, worker_error: torch.Tensor, stats: torch.Tensor, block_size: int,
                    scale: str, bits: int, n: int, total: torch.Tensor) -> torch.Tensor:
    """What each block's scale comes from, for x = rows + worker_error cut into n rows, into ``stats``: 1 bit, the
    float64 sums of |x|^p (``scale``'s power); levels, the float32 maxima of |x| (non-finite where x is). And
    total[0] <- 0.0 where every statistic is finite, else NaN (on a device in the same launch). No host wait;
    returns ``total``: the device part before the agreement (``Plan.agreed``)."""
    if bits == 1:
        codecs.block_sums(rows, worker_error, block_size, scale, n, stats, finite=total)
    else:
        codecs.block_absmax(rows, worker_error, block_size, n, stats, finite=total)
    return total


def agreed_statistics(plan: Plan, agreement: Agreement, rows: torch.Tensor, worker_error: torch.Tensor,
                      block_size: int, scale: str, bits: int, n: int, step: Step | None = None) -> torch.Tensor:
    """``statistics_into`` through ``plan.agreed`` (replayed on a steady call): the block statistics (the plan's
    workspace buffer "blocks.stats": a float64 sum per block for 1 bit, a float32 maximum for levels), which every
    rank agrees are all finite in the call's one host wait (at the caller's ``step``); returns them."""
    blocks = n * -(-(worker_error.numel() // n) // block_size)
    stats = plan.workspace.get("blocks.stats", blocks, torch.float64 if bits == 1 else torch.float32, plan.device)
    plan.agreed(agreement, "statistics", statistics_into, rows, worker_error, stats, block_size, scale, bits, n,
                step=step)
    return stats


def scatter_rows(rows: torch.Tensor, worker_error: torch.Tensor, stats: torch.Tensor, comm: Communicator,
                 workspace: Workspace, block_size: int, scale: str, bits: int, divisor: int,
                 weigh: Callable[[torch.Tensor], torch.Tensor] | None, out: torch.Tensor, count: int) -> None:
    """Steps 3-5 of ``compressed_reduce_scatter``: out[:count] <- the weighted sum of every rank's row for this rank.

    1. The block scales (1 bit: ``scale`` of each block; levels: the step over its largest)
       from ``stats`` (``statistics_into``), coded per row; encode x = rows + worker_error
       with the decoded scales into n framed wire rows (worker_error <- x - value).
    2. All-to-all of the rows.
    3. The received rows' decoded scales divided by ``divisor`` (IEEE division, as ``codecs.divide_``), then
       ``weigh``ed where given, are their weights; out[:count] <- sum of weight * sign or level, rank by rank in
       float32: without ``weigh`` in one launch that decodes the weights as it adds (``codecs.accumulate_framed``),
       with it the weights decoded first (``codecs.unframe_blocks``).
    """
    n, device, b = comm.size, worker_error.device, block_size
    row_len = worker_error.numel() // n
    blocks = -(-row_len // b)
    width = SCALE_BYTES + blocks + bits * row_len // 8
    send = workspace.get("scatter.send", n * width, torch.uint8, device).view(n, width)
    decoded = workspace.get("scatter.scales", n * blocks, torch.float32, device)
    if bits == 1:
        scales, packed = codecs.frame_scales(send, stats, scale, b, row_len, decoded)
        codecs.encode_blocks(rows, worker_error, scales.view(-1), b, packed)
    else:
        scales, packed = codecs.frame_scales(send, stats, out=decoded, bits=bits)
        codecs.encode_levels(rows, worker_error, scales.view(-1), b, bits, packed)
    received = workspace.get("scatter.received", n * width, torch.uint8, device)
    comm.alltoall(send.view(-1), received)
    weights = workspace.get("scatter.weights", n * blocks, torch.float32, device)
    if weigh is None:
        codecs.accumulate_framed(received.view(n, width), blocks, divisor, b, None, out, count, bits, weights)
        return
    weights, planes = codecs.unframe_blocks(received.view(n, width), blocks, divisor, weights)
    weights = weigh(weights)
    if bits == 1:
        codecs.accumulate_blocks(planes, weights, b, None, out, count)
    else:
        codecs.accumulate_levels(planes, weights, b, bits, out, count)


def _validate(tensor: torch.Tensor, out: torch.Tensor, worker_error: torch.Tensor, comm: Communicator, op: str,
              factor: float, block_size: int, scale: str, bits: int) -> None:
    """Local checks, made before any communication."""
    what, n = ScatterPlan.what, comm.size
    if not isinstance(tensor, torch.Tensor) or tensor.dtype not in codecs.SUPPORTED_DTYPES:
        raise TypeError(f"{what}: tensor must be a float32, float16 or bfloat16 torch.Tensor")
    codecs.check_device(tensor, comm.carries_meta)
    if tensor.dim() != 1 or not tensor.is_contiguous() or tensor.numel() % n:
        raise ValueError(f"{what}: tensor must be contiguous and 1-D with a multiple of the {n} ranks' elements "
                         f"(row r for rank r), got shape {tuple(tensor.shape)}")
    if (not isinstance(out, torch.Tensor) or out.dtype != tensor.dtype or out.device != tensor.device
            or out.dim() != 1 or not out.is_contiguous() or out.numel() != tensor.numel() // n):
        raise ValueError(f"{what}: out must be a contiguous 1-D tensor of {tensor.numel() // n} elements with the "
                         f"tensor's dtype {tensor.dtype} and device {tensor.device}")
    if op not in OPS:
        raise ValueError(f"{what}: op {op!r} is not one of {OPS}")
    if isinstance(factor, bool) or not isinstance(factor, (int, float)) or not factor == factor:
        raise ValueError(f"{what}: factor must be a number, got {factor!r}")
    if block_size is None:
        raise ValueError(f"{what}: block_size must be a power of two from 8 to 8192, got None")
    check_block_size(what, block_size)
    check_scale(what, scale)
    check_bits(what, bits)
    check_error_buffer(what, "worker_error", worker_error, tensor)
    length = n * row_elements(tensor.numel(), n)
    check_length(what, "worker_error", worker_error, length, f"{n} rows of row_elements({tensor.numel()}, {n})")
    check_disjoint(what, (("tensor", tensor), ("out", out), ("worker_error", worker_error)),
                   may_overlap=(frozenset(("tensor", "out")),))
