"""Plain numpy implementation of every codec step and of whole collectives: the test oracle.

Everything here favours being obviously right over being fast. It simulates the whole
world at once: a collective takes a list with one array per rank and returns one per rank.
The hierarchical simulations place rank r on node r // k, as ``ranks_per_node=k`` does.

The constants and the padding, hash and stream-key functions come from ``compcoll.spec``,
which the production code imports too. Summation order is part of the definition, so that the fused kernels can reproduce it bit
for bit: a sum of squares over ``x`` is taken in blocks of ``BLOCK`` elements; inside a block
lane ``l`` (``LANES`` lanes) sums ``x[l], x[l + LANES], ...`` sequentially in float64; the
``nblocks * LANES`` lane sums, block-major, are then added by ``tree_sum``.
"""

from __future__ import annotations

import numpy as np

from ..spec import (
    AGREEMENT_FIELDS, BLOCK, GOLDEN, LANES, SCALES, STAGES, UNIFORM_BITS, agreement_shares, block_lengths,
    block_scales_from, code_scales, level_step,
    mix64, padded_numel, scale_from, stream_key,
)

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


def tree_sum(values: np.ndarray) -> float:
    """Add values by a fixed pairwise tree.

    1. Pad with zeros to the next power of two.
    2. Repeatedly replace v by v[:half] + v[half:] until one value is left.
    """
    v = np.asarray(values, dtype=np.float64)
    size = 1
    while size < v.size:
        size *= 2
    v = np.concatenate([v, np.zeros(size - v.size)])
    while v.size > 1:
        half = v.size // 2
        v = v[:half] + v[half:]
    return float(v[0])


def average_rows(rows: np.ndarray) -> np.ndarray:
    """The float32 average of the rows of an (n, m) array: summed in row order, each sum rounded to float32, then
    divided by n (IEEE float32 division): what every rank computes alike for an exact average."""
    acc = rows[0].astype(np.float32)
    for row in rows[1:]:
        acc = (acc + row).astype(np.float32)
    return (acc / np.float32(len(rows))).astype(np.float32)


def power_sum(x: np.ndarray, power: int = 2) -> float:
    """Sum of |x|^power (power 1 or 2) of a float32 vector in the library's fixed order.

    1. Take every |x| (power 1) or square (power 2) exactly in float64 and pad with zeros to whole blocks.
    2. Sum each (block, lane) sequentially (np.cumsum is sequential by definition).
    3. Combine the block-major lane sums with ``tree_sum``.
    """
    values = np.abs(np.asarray(x, dtype=np.float32).astype(np.float64)) ** power
    nblocks = max(1, -(-values.size // BLOCK))
    padded = np.zeros(nblocks * BLOCK)
    padded[: values.size] = values
    lanes = np.cumsum(padded.reshape(nblocks, BLOCK // LANES, LANES), axis=1)[:, -1, :]
    return tree_sum(lanes.reshape(-1))


def sumsq(x: np.ndarray) -> float:
    """Sum of squares of a float32 vector in the library's fixed order (``power_sum`` with power 2)."""
    return power_sum(x, 2)


def segment_sumsq(x: np.ndarray, bounds: np.ndarray) -> np.ndarray:
    """Every segment's ``sumsq``: element j is that of x[bounds[j]:bounds[j + 1]], each in its own fixed order
    (an empty segment's is 0)."""
    return np.array([sumsq(x[lo:hi]) for lo, hi in zip(bounds[:-1], bounds[1:])], dtype=np.float64)


def scale_of(x: np.ndarray, d: int, scale: str = "l2") -> np.float32:
    """The 1-bit scale of ``x`` over d elements: "l2" ``||x||_2 / sqrt(d)`` (DeepSpeed's) or "l1" ``||x||_1 / d``."""
    return scale_from(power_sum(x, SCALES[scale]), d, scale)


def sign(x: np.ndarray) -> np.ndarray:
    """Sign as float32 with sign(0) = +1 (also for -0.0)."""
    return np.where(x >= 0, np.float32(1), np.float32(-1)).astype(np.float32)


def pack(q: np.ndarray) -> np.ndarray:
    """Pack signs into bytes, first element in the most significant bit (np.packbits order)."""
    return np.packbits(q > 0)


def unpack(bits: np.ndarray, count: int) -> np.ndarray:
    """Inverse of ``pack``: the first ``count`` signs as float32 +-1."""
    return np.unpackbits(bits)[:count].astype(np.float32) * 2 - 1


def pad(x: np.ndarray, length: int) -> np.ndarray:
    """``x`` as float32, zero-padded to ``length`` elements."""
    padded = np.zeros(length, dtype=np.float32)
    padded[: x.size] = x
    return padded


def compress(x: np.ndarray, error: np.ndarray, scale: str = "l2") -> tuple[np.ndarray, np.float32, np.ndarray]:
    """One error-compensated 1-bit compression.

    1. x = x + error (float32).
    2. s = ``scale_of(x, len(x), scale)``; q = sign(x).
    3. new error = x - s * q.

    Returns (packed bits, s, new error).
    """
    x = (np.asarray(x, dtype=np.float32) + error).astype(np.float32)
    s = scale_of(x, x.size, scale)
    q = sign(x)
    return pack(q), s, (x - s * q).astype(np.float32)


def block_sums(x: np.ndarray, block_size: int, power: int = 2, rows: int = 1) -> np.ndarray:
    """Float64 sums of |x|^power over the blocks of each of ``rows`` equal rows of ``x``, each summed sequentially.

    A row's blocks are ``block_size`` elements from its start, the last one shorter where
    needed (``spec.block_lengths``); row-major. Every |x| and square is exact in float64.
    """
    values = np.abs(np.asarray(x, dtype=np.float32).astype(np.float64)) ** power
    row_len = values.size // rows
    sums = []
    for row in values.reshape(rows, row_len):
        for start in range(0, row_len, block_size):
            block = row[start:start + block_size]
            sums.append(np.cumsum(block)[-1])
    return np.array(sums, dtype=np.float64)


def compress_blocks(x: np.ndarray, error: np.ndarray, block_size: int, scale: str = "l2", rows: int = 1
                    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``compress`` with one scale per block of ``block_size`` elements, sent as 8-bit codes per row.

    1. x = x + error (float32).
    2. s_b = ``block_scales_from(block_sums(x))`` for each block b of each of ``rows`` equal
       rows (wire rows: chunks; blocks restart at each row); q = sign(x).
    3. The scales of each row are coded against the row's largest (``code_scales``); s_b
       becomes its decoded value.
    4. new error = x - s_b * q on block b.

    Returns (packed bits, the decoded float32 block scales, new error).
    """
    x = (np.asarray(x, dtype=np.float32) + error).astype(np.float32)
    lengths = block_lengths(x.size // rows, block_size)
    exact = block_scales_from(block_sums(x, block_size, SCALES[scale], rows), np.tile(lengths, rows), scale)
    s = code_scales(exact.reshape(rows, -1))[2].reshape(-1)
    q = sign(x)
    return pack(q), s, (x - np.repeat(s, np.tile(lengths, rows)) * q).astype(np.float32)


def average_block_signs(bits: list[np.ndarray], scales: list[np.ndarray], count: int, block_size: int) -> np.ndarray:
    """``average_signs`` of one row of ``count`` elements with one scale per block (``spec.block_lengths``): term i
    of block b uses w_ib = float32(scales[i][b] / n)."""
    n = len(bits)
    lengths = block_lengths(count, block_size)
    acc = np.zeros(count, dtype=np.float32)
    for b, s in zip(bits, scales):
        w = np.repeat((np.asarray(s, np.float32) / np.float32(n)).astype(np.float32), lengths)
        acc = (acc + w * unpack(b, count)).astype(np.float32)
    return acc


def average_signs(bits: list[np.ndarray], scales: list[np.float32], count: int) -> np.ndarray:
    """(1/n) * sum_i scales[i] * unpack(bits[i]), summed in rank order in float32.

    Each term uses the weight w_i = float32(scales[i] / n).
    """
    n = len(bits)
    acc = np.zeros(count, dtype=np.float32)
    for b, s in zip(bits, scales):
        w = np.float32(np.float32(s) / np.float32(n))
        acc = (acc + w * unpack(b, count)).astype(np.float32)
    return acc


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


def block_absmax(x: np.ndarray, block_size: int, rows: int = 1) -> np.ndarray:
    """Float32 max |x| over the blocks of each of ``rows`` equal rows (``block_sums``' blocks); NaN where a block holds
    NaN."""
    values = np.abs(np.asarray(x, dtype=np.float32))
    row_len = values.size // rows
    out = []
    for row in values.reshape(rows, row_len):
        for start in range(0, row_len, block_size):
            block = row[start:start + block_size]
            out.append(np.nan if np.isnan(block).any() else block.max())
    return np.array(out, dtype=np.float32)


def level_codes(x: np.ndarray, steps: np.ndarray, bits: int) -> tuple[np.ndarray, np.ndarray]:
    """The ``bits``-bit level of each element of float32 ``x`` given its block's step, and its float32 value.

    1. t = float32(x / step) (0 where step is 0); c = clip(floor(float32(t + 2^(bits-1))), 0, 2^bits - 1).
    2. d = c - (2^bits - 1) / 2 (exact); value = float32(float64(d) * float64(step)) (the product exact, one
       rounding).
    """
    x = np.asarray(x, dtype=np.float32)
    steps = np.asarray(steps, dtype=np.float32)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        t = np.where(steps > 0, (x / np.where(steps > 0, steps, np.float32(1))).astype(np.float32), np.float32(0))
    top = (1 << bits) - 1
    c = np.clip(np.floor((t + np.float32(1 << (bits - 1))).astype(np.float32)), 0, top).astype(np.int64)
    d = c.astype(np.float64) - top / 2.0
    return c.astype(np.uint8), (d * steps.astype(np.float64)).astype(np.float32)


def pack_planes(codes: np.ndarray, bits: int, rows: int) -> np.ndarray:
    """(rows, bits * row_len / 8) bytes: for each row, plane j (bit j of every code, j = 0 first) packed as signs
    are."""
    table = codes.reshape(rows, -1)
    return np.concatenate([np.stack([pack(((row >> j) & 1).astype(np.float32) * 2 - 1) for j in range(bits)])
                           .reshape(-1)[None] for row in table])


def unpack_planes(planes: np.ndarray, bits: int, count: int) -> np.ndarray:
    """The first ``count`` codes of one row's planes (inverse of ``pack_planes``)."""
    per_plane = planes.size // bits
    codes = np.zeros(count, dtype=np.int64)
    for j in range(bits):
        codes |= (np.unpackbits(planes[j * per_plane:(j + 1) * per_plane])[:count].astype(np.int64) << j)
    return codes


def compress_levels(x: np.ndarray, error: np.ndarray, block_size: int, bits: int, rows: int = 1
                    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One error-compensated compression to ``bits``-bit uniform levels, one step per block.

    1. x = x + error (float32).
    2. step_b = ``level_step`` of block b's max |x|; the steps of each row coded against the row's
       largest (``code_scales``); step_b becomes its decoded value.
    3. Each element's level and value (``level_codes``); new error = x - value.

    Returns ((rows, bits * row_len / 8) planes, the decoded float32 steps, new error).
    """
    x = (np.asarray(x, dtype=np.float32) + error).astype(np.float32)
    row_len = x.size // rows
    steps = code_scales(level_step(block_absmax(x, block_size, rows), bits).reshape(rows, -1))[2].reshape(-1)
    per_element = np.repeat(steps.reshape(rows, -1), block_size, axis=1)[:, :row_len].reshape(-1)
    codes, values = level_codes(x, per_element, bits)
    return pack_planes(codes, bits, rows), steps, (x - values).astype(np.float32)


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


def thresholds(key: int, start: int, count: int) -> np.ndarray:
    """The uniform thresholds of elements start .. start+count-1 of a stream, in (-1, 1).

    1. u = mix64(key + (index + 1) * GOLDEN) >> 40 (the top 24 bits), modulo 2^64.
    2. r = (2u + 1 - 2^24) / 2^24: the midpoints of 2^24 equal cells of (-1, 1), exact in float64.
    """
    index = np.arange(start + 1, start + count + 1, dtype=np.uint64)
    u = mix64(np.uint64(key) + index * np.uint64(GOLDEN)) >> np.uint64(64 - UNIFORM_BITS)
    cells = float(1 << UNIFORM_BITS)
    return (u.astype(np.float64) * 2 + 1 - cells) / cells


def absmax_rows(x: np.ndarray, rows: int) -> np.ndarray:
    """max |x| over each of ``rows`` equal rows of a float32 vector (NaN if a row holds one)."""
    return np.abs(np.asarray(x, dtype=np.float32)).reshape(rows, -1).max(axis=1)


def binarize(z: np.ndarray, scales: np.ndarray, key: int, start: int) -> np.ndarray:
    """Birder's binary randomization (docs/architecture.md, "Exact numerics"), one scale per row, packed per row.

    Element i of row r, with s = scales[r] >= |z_i| and threshold t_i of index start + i:
    1. bit_i = z_i > t_i * s (in float64, where t_i * s is exact), so that
       P(bit_i) = (1 + z_i / s) / 2 up to the 2^-24 grid of t.
    2. The decode s * (2 bit_i - 1) is then an unbiased estimate of z_i.

    Returns the (rows, row_length / 8) packed bits.
    """
    rows = len(scales)
    z64 = np.asarray(z, dtype=np.float32).astype(np.float64).reshape(rows, -1)
    t = thresholds(key, start, z64.size).reshape(rows, -1)
    bits = z64 > t * np.asarray(scales, dtype=np.float32).astype(np.float64)[:, None]
    return np.packbits(bits, axis=1)


def _randomized_rows(z: np.ndarray, rows: int, key: int, start: int) -> tuple[np.ndarray, np.ndarray]:
    """(per-row max scales, packed rows) of ``z`` split into ``rows`` rows."""
    scales = absmax_rows(z, rows)
    return scales, binarize(z, scales, key, start)


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
        first.append(_randomized_rows(pad(x, full), k, stream_key(seed, step, STAGES["node"], r), 0))
    second = []
    for r in range(n):
        m, j = divmod(r, k)
        peers = [first[m * k + i] for i in range(k)]
        avg = average_signs([bits[j] for _, bits in peers], [scales[j] for scales, _ in peers], shard)
        second.append(_randomized_rows(avg, nodes, stream_key(seed, step, STAGES["inter"], r), j * shard))
    third = {}
    for r in range(n):
        m, j = divmod(r, k)
        peers = [second[p * k + j] for p in range(nodes)]
        avg = average_signs([bits[m] for _, bits in peers], [scales[m] for scales, _ in peers], sub)
        third[(j, m)] = _randomized_rows(avg, 1, stream_key(seed, step, STAGES["server"], r), j * shard + m * sub)
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
