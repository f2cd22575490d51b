"""The server steps the flat and hierarchical compressed allreduces share (docs/architecture.md, "Algorithms").

The worker sum's device part, the weights on the device, the worker's encode by s_w on the device, and the
exchange of chunks, their sum and its compression.
"""

from __future__ import annotations

from typing import NamedTuple, Sequence

import numpy as np
import torch

from .. import codecs
from ..comm import Communicator
from ..spec import SCALE_BYTES
from ..workspace import Workspace
from .agreement import Agreement
from .reduce_scatter import scatter_rows


def sum_into(tensor: torch.Tensor, worker_error: torch.Tensor, scale: str, total: torch.Tensor) -> torch.Tensor:
    """total[0] <- the float64 sum of |x|^p of x = tensor + worker_error, p the power of ``scale``
    (``codecs.compensated_sum``), with no host wait; returns ``total``: the worker scale's device part, which
    ``Plan.agreed`` replays and reads."""
    codecs.compensated_sum(tensor, worker_error, scale, out=total)
    return total


def device_scalars(scales: np.ndarray, divisor: int, scale: float, device: torch.device, workspace: Workspace
                   ) -> tuple[torch.Tensor, torch.Tensor]:
    """The server's weights s_i / ``divisor`` of the agreed worker scales ``scales`` (a host float64 array: the
    senders' of the round's values, picked with numpy, where torch's indexing by a list cost 4.7-12 us at 1-64 ranks
    against 1.6-3.0), and this rank's own scale ``scale``, on ``device`` in the workspace buffer "scalars".

    1. In a host buffer (on CUDA fresh pinned memory, ``codecs.pinned_like``; elsewhere the workspace's
       "scalars.host"): float32(s_i) for every i and a 0 behind them, all divided by ``divisor``
       (``codecs.divide_``), then ``scale`` in that last slot.
    2. One copy into "scalars" with no host wait (``codecs.to_device``), queued before the wire.
    Returns:
        (weights, scale) views of "scalars" (``Workspace.parts``): what the server and the encoder read from device
        memory.
    """
    count = scales.size
    scalars, weights, mine = workspace.parts("scalars", (count, 1), torch.float32, device)
    host = (codecs.pinned_like(scalars) if scalars.is_cuda
            else workspace.get("scalars.host", count + 1, torch.float32, torch.device("cpu")))
    values = host.numpy()
    values[:count] = scales
    values[count] = 0.0
    codecs.divide_(host, divisor)
    values[count] = scale
    codecs.to_device(host, scalars)
    return weights, mine


class AgreedSums(NamedTuple):
    """What ``encode_worker`` takes where the round ran on the device and left every rank's sum there
    (``sums_scalars``). A tuple, so that a replay's key holds its tensors (``replay.Replays``)."""

    weights: torch.Tensor
    """The server's weights, which the encode writes (the view ``device_scalars`` fills elsewhere)."""
    table: torch.Tensor
    first: int
    step: int
    """Rank r's sum is table[first + r * step] (``Agreement.device_sums``)."""
    senders: torch.Tensor
    """The int32 ranks whose weights the server takes, in its order, on the device (``Workspace.constant``)."""
    divisor: int


def sums_scalars(agreement: Agreement, senders: Sequence[int], divisor: int, device: torch.device,
                 workspace: Workspace) -> AgreedSums:
    """The server's weights s_i / ``divisor`` for the ranks ``senders`` (the round's rank numbers, in the server's
    order), to be written by the encode, and where the round on the device (NCCL's) left every rank's sum; the
    senders copied to the device once a plan."""
    table, first, step = agreement.device_sums()
    _, weights, _ = workspace.parts("scalars", (len(senders), 1), torch.float32, device)
    return AgreedSums(weights, table, first, step, workspace.constant("senders", senders, torch.int32, device), divisor)


def encode_worker(tensor: torch.Tensor, worker_error: torch.Tensor, scalars: AgreedSums | tuple, me: int, scale: str,
                  bits: torch.Tensor) -> torch.Tensor:
    """The worker's encode of x = tensor + worker_error into ``bits`` by s_w read on the device; returns the server's
    weights.

    1. ``scalars`` an ``AgreedSums`` (``sums_scalars``): the encode derives s_w from rank ``me``'s sum (this rank's
       number in the round), and writes every sender's weight s_i / divisor beside it, in its one launch
       (``codecs.compensate_encode_agreed``, the scale of worker_error.numel() elements).
    2. ``scalars`` = (weights, s_w) of ``device_scalars``: the encode reads s_w (``codecs.compensate_encode``).
    """
    if isinstance(scalars, AgreedSums):
        codecs.compensate_encode_agreed(tensor, worker_error, (scalars.table, scalars.first, scalars.step), me,
                                        scalars.senders, worker_error.numel(), scale, scalars.divisor,
                                        scalars.weights, bits)
        return scalars.weights
    weights, mine = scalars
    codecs.compensate_encode(tensor, worker_error, mine, bits)
    return weights


def serve(bits: torch.Tensor, weights: torch.Tensor, server_error: torch.Tensor, comm: Communicator,
          workspace: Workspace, scale: str = "l2") -> torch.Tensor:
    """Steps 4-6 of the gather-scatter protocol, up to the decode.

    1. All-to-all of the packed chunks of ``bits``.
    2. c = sum_i weights[i] * signs_i + server_error; s_s = ``scale`` of c over the chunk;
       server_error = c - s_s * sign(c); pack sign(c) behind s_s. On CUDA s_s is computed
       into the frame head by the accumulating launch and read from there by the encoder: the
       host does not wait for the all-to-all.
    3. All-gather of the framed server chunks.

    Returns:
        The (n, SCALE_BYTES + chunk / 8) wire rows, rank r's chunk in row r, the same on
        every rank; ``codecs.unframe`` splits them into scales and signs.
    """
    n = comm.size
    chunk = server_error.numel()
    cb = chunk // 8
    received = workspace.get("serve.chunks", n * cb, torch.uint8, bits.device)
    comm.alltoall(bits, received)
    send = workspace.get("serve.server", codecs.SCALE_BYTES + cb, torch.uint8, bits.device)
    server_scale = codecs.accumulate_scale(received.view(n, cb), weights, server_error, server_error, chunk, chunk,
                                           scale, head=send)
    codecs.compensate_encode(None, server_error, server_scale, send[codecs.SCALE_BYTES:])
    gathered = workspace.get("serve.gathered", n * send.numel(), torch.uint8, bits.device)
    comm.allgather(send, gathered)
    return gathered.view(n, -1)


def serve_blocks(source: torch.Tensor, worker_error: torch.Tensor, server_error: torch.Tensor, sums: torch.Tensor,
                 comm: Communicator, workspace: Workspace, block_size: int, scale: str = "l2") -> torch.Tensor:
    """Steps 3-6 of the gather-scatter protocol with one scale per block, up to the decode.

    1. The block scales (from ``sums``, those of source + worker_error by chunk: ``block_sums``
       with n rows) coded per rank's chunk;
       encode with the decoded scales into n wire rows, each chunk's packed signs behind its
       largest scale and its codes.
    2. All-to-all of the rows; c = sum_i (s_w[i, b] / n) * signs_i + server_error, the weights decoded from the
       rows as it adds (``codecs.accumulate_framed``).
    3. c's block scales, coded over the chunk; server_error = c - s_s * sign(c), packed into
       one row behind them.
    4. All-gather of the served rows.

    Returns:
        The (n, SCALE_BYTES + ceil(chunk / block_size) + chunk / 8) wire rows, rank r's chunk in row
        r, the same on every rank; ``codecs.unframe_blocks`` splits them into scales and signs.
    """
    n, device, b = comm.size, worker_error.device, block_size
    chunk = server_error.numel()
    blocks = -(-chunk // b)
    width = SCALE_BYTES + blocks + chunk // 8
    send = workspace.get("blocks.send", n * width, torch.uint8, device).view(n, width)
    scales, signs = codecs.frame_scales(send, sums, scale, b, chunk,
                                        workspace.get("blocks.scales", n * blocks, torch.float32, device))
    codecs.encode_blocks(source, worker_error, scales.view(-1), b, signs)
    received = workspace.get("blocks.received", n * width, torch.uint8, device)
    comm.alltoall(send.view(-1), received)
    codecs.accumulate_framed(received.view(n, width), blocks, n, b, server_error, server_error, chunk,
                             weights=workspace.get("blocks.weights", n * blocks, torch.float32, device))
    served = workspace.get("blocks.served", width, torch.uint8, device).view(1, width)
    sums = codecs.block_sums(None, server_error, b, scale, 1,
                             workspace.get("blocks.server_sums", blocks, torch.float64, device))
    mine, signs = codecs.frame_scales(served, sums, scale, b, chunk,
                                      workspace.get("blocks.server_scales", blocks, torch.float32, device))
    codecs.encode_blocks(None, server_error, mine.view(-1), b, signs)
    gathered = workspace.get("blocks.gathered", n * width, torch.uint8, device)
    comm.allgather(served.view(-1), gathered)
    return gathered.view(n, width)


def serve_levels(source: torch.Tensor, worker_error: torch.Tensor, server_error: torch.Tensor, absmax: torch.Tensor,
                 comm: Communicator, workspace: Workspace, block_size: int, bits: int) -> torch.Tensor:
    """``serve_blocks`` with ``bits``-bit levels instead of signs, up to the decode.

    1-2. ``reduce_scatter.scatter_rows``: the block steps (from ``absmax``, the block maxima of
       source + worker_error by chunk) coded per chunk, levels encoded behind them, all-to-all;
       c = sum_i float32(level_i * step_i / n) rank by rank.
    3. c + server_error encoded the same way into one row (the server error keeps the rest).
    4. All-gather of the served rows.

    Returns:
        The (n, SCALE_BYTES + ceil(chunk / block_size) + bits * chunk / 8) wire rows, rank r's
        chunk in row r, the same on every rank.
    """
    n, device, b = comm.size, worker_error.device, block_size
    chunk = server_error.numel()
    width = SCALE_BYTES + -(-chunk // b) + bits * chunk // 8
    summed = workspace.get("levels.sum", chunk, torch.float32, device)
    scatter_rows(source, worker_error, absmax, comm, workspace, b, "l2", bits, n, None, summed, chunk)
    served = workspace.get("levels.served", width, torch.uint8, device).view(1, width)
    top = codecs.block_absmax(summed, server_error, b, 1, workspace.get("levels.top", -(-chunk // b), torch.float32,
                                                                        device))
    steps = workspace.get("levels.server_steps", top.numel(), torch.float32, device)
    mine, planes = codecs.frame_scales(served, top, out=steps, bits=bits)
    codecs.encode_levels(summed, server_error, mine.view(-1), b, bits, planes)
    gathered = workspace.get("levels.gathered", n * width, torch.uint8, device)
    comm.allgather(served.view(-1), gathered)
    return gathered.view(n, width)
