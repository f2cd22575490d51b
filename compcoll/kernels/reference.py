"""Plain numpy implementation of every codec step and of whole collectives: the test oracle.

Everything here favours being obviously right over being fast. It simulates the whole
world at once: a collective takes a list with one array per rank and returns one per rank.

Summation order is part of the definition, so that the fused kernels can reproduce it bit
for bit: a sum of squares over ``x`` is taken in blocks of ``BLOCK`` elements; inside a block
lane ``l`` (``LANES`` lanes) sums ``x[l], x[l + LANES], ...`` sequentially in float64; the
``nblocks * LANES`` lane sums, block-major, are then added by ``tree_sum``.
"""

from __future__ import annotations

import numpy as np

LANES = 32
BLOCK = 8192
META_FIELDS = 5


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


def sumsq(x: np.ndarray) -> float:
    """Sum of squares of a float32 vector in the library's fixed order.

    1. Square every element exactly in float64 and pad with zeros to whole blocks.
    2. Sum each (block, lane) sequentially (np.cumsum is sequential by definition).
    3. Combine the block-major lane sums with ``tree_sum``.
    """
    sq = np.asarray(x, dtype=np.float32).astype(np.float64) ** 2
    nblocks = max(1, -(-sq.size // BLOCK))
    padded = np.zeros(nblocks * BLOCK)
    padded[: sq.size] = sq
    lanes = np.cumsum(padded.reshape(nblocks, BLOCK // LANES, LANES), axis=1)[:, -1, :]
    return tree_sum(lanes.reshape(-1))


def l2_scale(x: np.ndarray, d: int) -> np.float32:
    """DeepSpeed's scale ``||x||_2 / sqrt(d)`` computed in float64, rounded to float32."""
    return np.float32(np.sqrt(sumsq(x)) / np.sqrt(d))


def sign(x: np.ndarray) -> np.ndarray:
    """Sign as float32 with sign(0) = +1 (also for -0.0)."""
    return np.where(x >= 0, np.float32(1), np.float32(-1)).astype(np.float32)


def pack(q: np.ndarray) -> np.ndarray:
    """Pack signs into bytes, first element in the most significant bit (np.packbits order)."""
    return np.packbits(q > 0)


def unpack(bits: np.ndarray, count: int) -> np.ndarray:
    """Inverse of ``pack``: the first ``count`` signs as float32 +-1."""
    return np.unpackbits(bits)[:count].astype(np.float32) * 2 - 1


def padded_numel(numel: int, world_size: int) -> int:
    """Smallest multiple of 8 * world_size that is >= numel."""
    unit = 8 * world_size
    return -(-numel // unit) * unit


def compress(x: np.ndarray, error: np.ndarray) -> tuple[np.ndarray, np.float32, np.ndarray]:
    """One error-compensated 1-bit compression.

    1. x = x + error (float32).
    2. s = ||x||_2 / sqrt(len(x)); q = sign(x).
    3. new error = x - s * q.

    Returns (packed bits, s, new error).
    """
    x = (np.asarray(x, dtype=np.float32) + error).astype(np.float32)
    s = l2_scale(x, x.size)
    q = sign(x)
    return pack(q), s, (x - s * q).astype(np.float32)


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
) -> tuple[list[np.ndarray], list[np.ndarray], list[np.ndarray], list[int]]:
    """Error-compensated 1-bit allreduce of DESIGN §3.1, simulated for the whole world.

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

    Returns:
        (outputs (float32, unpadded), new worker errors, new server errors,
        payload bytes sent per rank).
    """
    n = len(xs)
    numel = xs[0].size
    np_ = padded_numel(numel, n)
    chunk = np_ // n
    cb = chunk // 8
    packed, scales, new_we = [], [], []
    for x, we in zip(xs, worker_errors):
        padded = np.zeros(np_, dtype=np.float32)
        padded[:numel] = x
        bits, s, err = compress(padded, we)
        packed.append(bits)
        scales.append(s)
        new_we.append(err)
    meta_bytes = (n - 1) * META_FIELDS * 8
    if protocol == "allgather":
        avg = average_signs(packed, scales, np_)[:numel]
        sent = meta_bytes + (n - 1) * (np_ // 8)
        return [avg.copy() for _ in range(n)], new_we, [e.copy() for e in server_errors], [sent] * n
    server_bits, server_scales, new_se = [], [], []
    for r in range(n):
        c = average_signs([b[r * cb:(r + 1) * cb] for b in packed], scales, chunk)
        bits, s, err = compress(c, server_errors[r])
        server_bits.append(bits)
        server_scales.append(s)
        new_se.append(err)
    out = np.concatenate([s * unpack(b, chunk) for b, s in zip(server_bits, server_scales)])
    out = out.astype(np.float32)[:numel]
    sent = meta_bytes + (n - 1) * cb + (n - 1) * (cb + 4)
    return [out.copy() for _ in range(n)], new_we, new_se, [sent] * n
