"""Whole collectives simulated for the world at once, and the bytes each rank sends.

A list with one array per rank in, one per rank out.
"""

from __future__ import annotations

import numpy as np

from ...spec import AGREEMENT_FIELDS, STAGES, agreement_shares, block_lengths, padded_numel, stream_key
from .blocks import average_block_signs, compress_blocks
from .levels import compress_levels, unpack_planes
from .randomized import randomized_rows
from .signs import average_signs, compress, pad, unpack
from .sums import average_rows


META_FIELDS = AGREEMENT_FIELDS
"""Float64 fields each rank all-gathers to every peer in one agreement round, up to ``GATHERED_AGREEMENT_RANKS``."""


def agreement_sent(n: int, values: tuple[bool, ...], ranks_per_node: int | None = None) -> list:
    """Bytes each rank sends in a call's agreement rounds (``spec.agreement_shares``), one round per entry.

    ``values[i]``: whether round i agrees on a value (a scale). Returns, by rank, the total,
    or (intra-node, inter-node) bytes with ``ranks_per_node``.
    """
    totals = []
    for rank in range(n):
        shares = [sum(b) for b in zip(*(agreement_shares(n, rank, value) for value in values))]
        if ranks_per_node is None:
            totals.append(sum(shares))
        else:
            intra = sum(b for r, b in enumerate(shares) if r // ranks_per_node == rank // ranks_per_node)
            totals.append((intra, sum(shares) - intra))
    return totals


def compressed_allreduce(
    xs: list[np.ndarray],
    worker_errors: list[np.ndarray],
    server_errors: list[np.ndarray],
    protocol: str = "gather_scatter",
    scale: str = "l2",
    block_size: int | None = None,
    bits: int = 1,
) -> tuple[list[np.ndarray], list[np.ndarray], list[np.ndarray], list[int]]:
    """Error-compensated 1-bit allreduce (docs/architecture.md, "Algorithms"), simulated for the whole world.

    Gather-scatter protocol:
    1. Every rank pads its flat float32 input to Np, compresses it with its worker error.
    2. Rank r receives chunk r of every rank's bits and every rank's scale.
    3. Rank r averages the decoded chunks, compresses that with its server error.
    4. Every rank receives every server chunk and scale and decodes them.
    Allgather protocol: every rank receives every rank's whole bits and scale and returns
    their average (step 2-3 of the gather-scatter protocol on the full vector, no server
    compression); server errors are untouched.

    Args:
        xs: one flat float32 vector per rank, all of the same length.
        worker_errors: one float32 vector of length Np per rank.
        server_errors: one float32 vector of length Np / n per rank.
        protocol: "gather_scatter" or "allgather".
        scale: "l2" or "l1" (``scale_of``), for the worker and the server compression.
        block_size: None (one scale per compressed vector or chunk) or a power of two: one
            scale per block of that many elements (``compress_blocks``; blocks restart at each
            chunk, the last one of a chunk shorter where needed), for the worker and the server
            compression; each packed chunk travels behind its largest scale (4 bytes) and its
            blocks' 8-bit codes.
        bits: 1 (signs) or 2-8: uniform levels, gather-scatter with a block_size
            (``_levels_allreduce``).

    Returns:
        (outputs (float32, unpadded), new worker errors, new server errors,
        payload bytes sent per rank).
    """
    n = len(xs)
    if block_size is not None:
        return _blockwise_allreduce(xs, worker_errors, server_errors, protocol, scale, block_size, bits)
    numel = xs[0].size
    np_ = padded_numel(numel, n)
    chunk = np_ // n
    cb = chunk // 8
    packed, scales, new_we = [], [], []
    for x, we in zip(xs, worker_errors):
        bits, s, err = compress(pad(x, np_), we, scale)
        packed.append(bits)
        scales.append(s)
        new_we.append(err)
    meta = agreement_sent(n, (True,))
    if protocol == "allgather":
        avg = average_signs(packed, scales, np_)[:numel]
        return [avg.copy() for _ in range(n)], new_we, [e.copy() for e in server_errors], [
            m + (n - 1) * (np_ // 8) for m in meta]
    server_bits, server_scales, new_se = [], [], []
    for r in range(n):
        c = average_signs([b[r * cb:(r + 1) * cb] for b in packed], scales, chunk)
        bits, s, err = compress(c, server_errors[r], scale)
        server_bits.append(bits)
        server_scales.append(s)
        new_se.append(err)
    out = np.concatenate([s * unpack(b, chunk) for b, s in zip(server_bits, server_scales)])
    out = out.astype(np.float32)[:numel]
    return [out.copy() for _ in range(n)], new_we, new_se, [m + (n - 1) * cb + (n - 1) * (cb + 4) for m in meta]


def _blockwise_allreduce(
    xs: list[np.ndarray],
    worker_errors: list[np.ndarray],
    server_errors: list[np.ndarray],
    protocol: str,
    scale: str,
    block_size: int,
    bits: int = 1,
) -> tuple[list[np.ndarray], list[np.ndarray], list[np.ndarray], list[int]]:
    """``compressed_allreduce`` with one scale per block (``compress_blocks``); same steps, same returns. With
    ``bits`` > 1 (gather-scatter): ``_levels_allreduce``."""
    if bits > 1:
        return _levels_allreduce(xs, worker_errors, server_errors, block_size, bits)
    n, numel, b = len(xs), xs[0].size, block_size
    np_ = padded_numel(numel, n)
    chunk, cb = np_ // n, np_ // (8 * n)
    blocks = -(-chunk // b)
    packed, scales, new_we = [], [], []
    for x, we in zip(xs, worker_errors):
        bits, s, err = compress_blocks(pad(x, np_), we, b, scale, n if protocol == "gather_scatter" else 1)
        packed.append(bits)
        scales.append(s)
        new_we.append(err)
    meta = agreement_sent(n, (False,))
    if protocol == "allgather":
        avg = average_block_signs(packed, scales, np_, b)[:numel]
        return [avg.copy() for _ in range(n)], new_we, [e.copy() for e in server_errors], [
            m + (n - 1) * (4 + np_ // 8 + -(-np_ // b)) for m in meta]
    server_bits, server_scales, new_se = [], [], []
    for r in range(n):
        c = average_block_signs([p[r * cb:(r + 1) * cb] for p in packed], [s[r * blocks:(r + 1) * blocks]
                                                                           for s in scales], chunk, b)
        bits, s, err = compress_blocks(c, server_errors[r], b, scale)
        server_bits.append(bits)
        server_scales.append(s)
        new_se.append(err)
    lengths = block_lengths(chunk, b)
    out = np.concatenate([np.repeat(s, lengths) * unpack(p, chunk) for p, s in zip(server_bits, server_scales)])
    out = out.astype(np.float32)[:numel]
    return [out.copy() for _ in range(n)], new_we, new_se, [m + 2 * (n - 1) * (4 + blocks + cb) for m in meta]


def compressed_reduce_scatter(
    xs: list[np.ndarray], worker_errors: list[np.ndarray], block_size: int, scale: str = "l2", op: str = "avg",
    factor: float = 1.0, bits: int = 1,
) -> tuple[list[np.ndarray], list[np.ndarray], list[int]]:
    """``algorithms.reduce_scatter.compressed_reduce_scatter`` over the whole world: each rank's x is n rows of S.

    1. Rank i's rows, zero-padded to Sp = S rounded up to a multiple of 8, plus its worker
       error: ``compress_blocks`` (1 bit) or ``compress_levels`` (2-8 bits) with n rows (block
       scales or steps coded per row).
    2. Rank r's output: sum_i w_ik * d_i(row r)_k in rank order (float32) for k < S, d the sign
       (1 bit; the product is exact) or the level c - (2^bits - 1) / 2 (the product taken in
       float64, exact, then rounded to float32), w_ik the decoded scale or step of element k's
       block in rank i's row r: float32(s / n) ("avg"), s ("sum") or float32(s * float32(factor))
       ("premul_sum").

    Returns (outputs (float32, S each), new worker errors, bytes sent per rank).
    """
    n, b = len(xs), block_size
    row = xs[0].size // n
    padded = -(-row // 8) * 8
    blocks = -(-padded // b)
    packed, scales, errors = [], [], []
    for x, error in zip(xs, worker_errors):
        rows = np.zeros((n, padded), dtype=np.float32)
        rows[:, :row] = np.asarray(x, dtype=np.float32).reshape(n, row)
        if bits == 1:
            signs, s, new = compress_blocks(rows.reshape(-1), error, b, scale, n)
            packed.append(signs.reshape(n, -1))
        else:
            planes, s, new = compress_levels(rows.reshape(-1), error, b, bits, n)
            packed.append(planes)
        scales.append(s.reshape(n, blocks))
        errors.append(new)
    outputs = []
    for r in range(n):
        acc = np.zeros(row, dtype=np.float32)
        for rows_i, s in zip(packed, scales):
            w = s[r]
            if op == "avg":
                w = (w / np.float32(n)).astype(np.float32)
            elif op == "premul_sum":
                w = (w * np.float32(factor)).astype(np.float32)
            if bits == 1:
                d = unpack(rows_i[r], padded)[:row].astype(np.float64)
            else:
                d = unpack_planes(rows_i[r], bits, row).astype(np.float64) - ((1 << bits) - 1) / 2.0
            term = (d * np.repeat(w, b)[:row].astype(np.float64)).astype(np.float32)
            acc = (acc + term).astype(np.float32)
        outputs.append(acc)
    sent = [m + (n - 1) * (4 + blocks + bits * padded // 8) for m in agreement_sent(n, (False,))]
    return outputs, errors, sent


def _levels_allreduce(
    xs: list[np.ndarray], worker_errors: list[np.ndarray], server_errors: list[np.ndarray], block_size: int,
    bits: int,
) -> tuple[list[np.ndarray], list[np.ndarray], list[np.ndarray], list[int]]:
    """Gather-scatter with ``bits``-bit levels.

    1. Each rank's padded vector is n chunks: ``compressed_reduce_scatter`` ("avg") gives rank r
       the sum c_r of the chunks r.
    2. Rank r compresses c_r + its server error (``compress_levels``, one row).
    3. Every rank decodes every served chunk: float32(level * step) (the value the server used).
    """
    n, numel, b = len(xs), xs[0].size, block_size
    np_ = padded_numel(numel, n)
    chunk = np_ // n
    blocks = -(-chunk // b)
    sums, new_we, _ = compressed_reduce_scatter([pad(x, np_) for x in xs], worker_errors, b, "l2", "avg", 1.0, bits)
    out, new_se = [], []
    for c, error in zip(sums, server_errors):
        planes, steps, new = compress_levels(c, error, b, bits)
        new_se.append(new)
        levels = unpack_planes(planes[0], bits, chunk).astype(np.float64) - ((1 << bits) - 1) / 2.0
        out.append((np.float32(0) + (levels * np.repeat(steps, b)[:chunk].astype(np.float64)).astype(np.float32))
                   .astype(np.float32))
    result = np.concatenate(out)[:numel]
    sent = [m + 2 * (n - 1) * (4 + blocks + bits * chunk // 8) for m in agreement_sent(n, (False,))]
    return [result.copy() for _ in range(n)], new_we, new_se, sent


def hierarchical_allreduce(
    xs: list[np.ndarray], ranks_per_node: int, seed: int, step: int
) -> tuple[list[np.ndarray], list[tuple[int, int]]]:
    """Birder's all-1-bit hierarchical allreduce (docs/architecture.md, "Algorithms"), simulated for the whole world.

    n = N * k ranks, rank r = node m * k + local rank j; Np = padded_numel(numel, n),
    shard j = elements [j Np/k, (j+1) Np/k), split into N sub-chunks of Np/n.
    1. Every rank binarizes its padded input, one max scale per shard (stream "node").
    2. Local rank j of node m averages its node's k shard-j rows (weights float32(s/k)),
       then binarizes that, one max scale per sub-chunk (stream "inter").
    3. Local rank j of node m averages sub-chunk m of shard j from all N nodes
       (weights float32(s/N)) and binarizes it with one max scale (stream "server").
    4. Every rank decodes all n sub-chunks: shard j's, sub-chunk m's row comes from
       rank m * k + j.
    Index i of every stream is the element's position in the padded vector.

    Returns:
        (outputs (float32, unpadded), (intra-node, inter-node) payload bytes per rank).
    """
    n, k = len(xs), ranks_per_node
    nodes = n // k
    numel = xs[0].size
    full = padded_numel(numel, n)
    shard, sub = full // k, full // n
    first = []
    for r, x in enumerate(xs):
        first.append(randomized_rows(pad(x, full), k, stream_key(seed, step, STAGES["node"], r), 0))
    second = []
    for r in range(n):
        m, j = divmod(r, k)
        peers = [first[m * k + i] for i in range(k)]
        avg = average_signs([bits[j] for _, bits in peers], [scales[j] for scales, _ in peers], shard)
        second.append(randomized_rows(avg, nodes, stream_key(seed, step, STAGES["inter"], r), j * shard))
    third = {}
    for r in range(n):
        m, j = divmod(r, k)
        peers = [second[p * k + j] for p in range(nodes)]
        avg = average_signs([bits[m] for _, bits in peers], [scales[m] for scales, _ in peers], sub)
        third[(j, m)] = randomized_rows(avg, 1, stream_key(seed, step, STAGES["server"], r), j * shard + m * sub)
    out = np.concatenate(
        [third[(j, m)][0][0] * unpack(third[(j, m)][1][0], sub) for j in range(k) for m in range(nodes)]
    ).astype(np.float32)[:numel]
    intra = (k - 1) * (4 + shard // 8) + (k - 1) * nodes * (4 + sub // 8)
    inter = 2 * (nodes - 1) * (4 + sub // 8)
    return [out.copy() for _ in range(n)], [(intra + a, inter + e) for a, e in agreement_sent(n, (False,), k)]


def hierarchical_compressed_allreduce(
    xs: list[np.ndarray],
    worker_errors: list[np.ndarray],
    server_errors: list[np.ndarray],
    ranks_per_node: int,
    scale: str = "l2",
    block_size: int | None = None,
    protocol: str = "gather_scatter",
) -> tuple[list[np.ndarray], list[np.ndarray], list[np.ndarray], list[tuple[int, int]]]:
    """The error-compensated hierarchical allreduce, simulated for the whole world.

    n = N * k ranks, rank r = node m * k + local rank j; Np = padded_numel(numel, n).
    1. Node average of shard j at local rank j: the k ranks' float32 shards summed in
       local-rank order, divided by k.
    2. The N local ranks j run ``compressed_allreduce`` (``protocol``, ``scale``,
       ``block_size``) on their node averages with their own worker errors (length Np/k)
       and server errors (Np/n).
    3. Gather-scatter: every rank decodes every shard's server rows. Allgather: every
       rank gets every shard's N packed rows (no scales: the agreement carried them) and
       averages them.

    Returns:
        (outputs, new worker errors, new server errors, (intra-node, inter-node) bytes
        per rank).
    """
    n, k = len(xs), ranks_per_node
    nodes = n // k
    numel = xs[0].size
    full = padded_numel(numel, n)
    shard, sub = full // k, full // n
    padded = [pad(x, full).reshape(k, shard) for x in xs]
    new_we, new_se = list(worker_errors), list(server_errors)
    pieces = []
    for j in range(k):
        averages = [average_rows(np.stack([padded[m * k + i][j] for i in range(k)])) for m in range(nodes)]
        group = [m * k + j for m in range(nodes)]
        outs, wes, ses, _ = compressed_allreduce(
            averages, [worker_errors[r] for r in group], [server_errors[r] for r in group], protocol, scale=scale,
            block_size=block_size,
        )
        pieces.append(outs[0])
        for r, we, se in zip(group, wes, ses):
            new_we[r], new_se[r] = we, se
    out = np.concatenate(pieces).astype(np.float32)[:numel]
    cb = sub // 8
    if protocol == "allgather":
        intra = (k - 1) * 4 * shard + (k - 1) * nodes * (shard // 8)
        inter = (nodes - 1) * (shard // 8)
    elif block_size is None:
        intra = (k - 1) * 4 * shard + (k - 1) * nodes * (4 + cb)
        inter = (nodes - 1) * (2 * cb + 4)
    else:
        row = 4 + -(-sub // block_size) + cb
        intra = (k - 1) * 4 * shard + (k - 1) * nodes * row
        inter = 2 * (nodes - 1) * row
    meta = agreement_sent(n, (False, block_size is None), k)
    return [out.copy() for _ in range(n)], new_we, new_se, [(intra + a, inter + e) for a, e in meta]
