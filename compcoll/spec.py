"""The numerics and wire constants every implementation shares: padding, summation blocks, frames, random streams.

Production code (codecs, kernels, algorithms) and the numpy reference (``kernels.reference``)
both import them from here; docs/architecture.md ("Exact numerics") says where each is tested.
"""

from __future__ import annotations

import math

import numpy as np

LANES = 32
"""Float64 accumulators per summation block: element i of a block adds to lane i % LANES."""
BLOCK = 8192
"""Elements per summation block; the block-major lane sums are then added by a pairwise tree."""
SCALE_BYTES = 4
"""A scale travels in front of its packed chunk as 4 native-endian float32 bytes."""

MASK64 = (1 << 64) - 1
GOLDEN = 0x9E3779B97F4A7C15
MIX1 = 0xBF58476D1CE4E5B9
MIX2 = 0x94D049BB133111EB
UNIFORM_BITS = 24
"""Bits of a threshold: the midpoints of 2^24 equal cells of (-1, 1), exact in float64."""
AGREEMENT_FIELDS = 3
"""Float64 fields of each rank's status in an agreement round, for every collective: (signature, finite?, scale)."""
GATHERED_AGREEMENT_RANKS = 64
"""Up to this many ranks, an agreement round all-gathers the statuses (point to point, so a timeout names the ranks
that sent nothing); above it, the ranks allreduce ``SUMMED_AGREEMENT_FIELDS`` instead, whose bytes do not grow with
the ranks, and all-gather the statuses only when the sums say a call failed (docs/architecture.md, "Plans")."""
SUMMED_AGREEMENT_FIELDS = 10
"""Float64 fields each rank adds in a summed agreement round: the plan signature's four bytes, their squares,
refused?, and not finite?. The signatures agree where n * sum(b^2) == sum(b)^2 for each byte b, exact in float64
up to ``MAX_AGREEMENT_RANKS``."""
MAX_AGREEMENT_RANKS = 1 << 18
"""The most ranks a summed agreement round's float64 sums stay exact for."""


def summed_agreement(n: int) -> bool:
    """Whether n ranks agree by an allreduce (more than ``GATHERED_AGREEMENT_RANKS``) rather than an all-gather."""
    return n > GATHERED_AGREEMENT_RANKS


def summed_fields(signature: float, finite: bool) -> list[float]:
    """A rank's ``SUMMED_AGREEMENT_FIELDS`` float64s in a summed agreement round: the signature's four bytes b,
    lowest first (0s for a negative signature: a rank that refused its call), their squares b^2, refused? (the
    signature negative), not finite?."""
    digits = [float((int(signature) >> shift) & 0xFF) for shift in (0, 8, 16, 24)] if signature >= 0 else [0.0] * 4
    return digits + [b * b for b in digits] + [float(signature < 0), float(not finite)]


def agreement_shares(n: int, rank: int, value: bool) -> list[int]:
    """Bytes one agreement round (``check``) sends from ``rank`` to each rank (0 to itself) on n ranks.

    1. Up to ``GATHERED_AGREEMENT_RANKS``: an all-gather of ``AGREEMENT_FIELDS`` float64s to every peer.
    2. Above: an allreduce of ``SUMMED_AGREEMENT_FIELDS`` float64s (``allreduce_shares``), and, for a call that
       agrees on a value (a scale), an all-gather of that one float64.
    """
    if not summed_agreement(n):
        return [0 if r == rank else 8 * AGREEMENT_FIELDS for r in range(n)]
    shares = allreduce_shares(n, rank, 8 * SUMMED_AGREEMENT_FIELDS)
    return [b + (8 if value and r != rank else 0) for r, b in enumerate(shares)]


def allreduce_shares(n: int, rank: int, nbytes: int) -> list[int]:
    """Bytes a rank is counted as sending to each rank (0 to itself) by an allreduce of ``nbytes`` on n ranks.

    1. The total is a ring allreduce's 2(n-1)/n of the tensor, rounded down.
    2. It is spread evenly over the other ranks in rank order; the first ones take the remainder.
    """
    peers = [r for r in range(n) if r != rank]
    shares = [0] * n
    if peers:
        share, extra = divmod(2 * (n - 1) * nbytes // n, len(peers))
        for i, peer in enumerate(peers):
            shares[peer] = share + (i < extra)
    return shares


SCALES = {"l2": 2, "l1": 1}
"""The 1-bit scales, each with the power p of its sum of |x|^p (docs/architecture.md, "Exact numerics"):
"l2" is DeepSpeed's ||x||_2 / sqrt(d); "l1" is mean |x| = ||x||_1 / d, the s that minimises ||x - s sign(x)||_2."""
PROTOCOLS = ("gather_scatter", "allgather")
"""The flat 1-bit allreduce's protocols: compress twice (by the sender, and the sum of each chunk by the rank that
serves it) or once (every rank averages all ranks' 1-bit estimates); docs/architecture.md, "Algorithms"."""
CHANNEL_PROTOCOLS = (*PROTOCOLS, "auto")
"""What the optimizers' ``protocol`` takes: one of ``PROTOCOLS``, or "auto" (``protocol_for``)."""


def protocol_for(protocol: str, members: int) -> str:
    """The protocol of ``PROTOCOLS`` that ``protocol`` stands for between ``members`` ranks (flat) or nodes
    (hierarchical): "auto" is "allgather" for 2 members or fewer, where it sends what gather-scatter does and
    compresses once instead of twice, and "gather_scatter" for more; any other is itself."""
    if protocol != "auto":
        return protocol
    return "allgather" if members <= 2 else "gather_scatter"


STAGES = {"node": 1, "inter": 2, "server": 3}
"""The stage numbers mixed into Birder's random streams."""


def scale_from(total: float, d: int, scale: str) -> np.float32:
    """The float32 scale of a d-element vector from its float64 sum of |x|^p (p = ``SCALES[scale]``).

    1. "l2": sqrt(total) / sqrt(d); "l1": total / d; both in float64 (an empty vector's is 0).
    2. Round to float32.
    """
    if d == 0:
        return np.float32(0.0)
    if scale == "l2":  # math.sqrt and np.sqrt are both IEEE's correctly rounded float64 root; math's is faster
        return np.float32(math.sqrt(total) / math.sqrt(d)) if total >= 0 else np.float32(np.nan)
    return np.float32(total / d)


def scales_from(totals: np.ndarray, d: int, scale: str) -> np.ndarray:
    """``scale_from`` of each float64 of ``totals``, as a float32 array, in one pass: the same IEEE operations
    (numpy's sqrt and division are correctly rounded as math's), so the same bits, NaN for a negative or NaN total
    under "l2"."""
    if d == 0:
        return np.zeros(len(totals), np.float32)
    with np.errstate(invalid="ignore", over="ignore"):
        if scale == "l2":
            return (np.sqrt(totals) / math.sqrt(d)).astype(np.float32)
        return (totals / d).astype(np.float32)


CODES_PER_OCTAVE = 8
"""Block scales travel as 8-bit codes: code k < 255 is the row's largest scale times 2^(-k / 8), code 255 is zero."""
SCALE_STEPS = np.concatenate([np.exp2(-np.arange(255) / CODES_PER_OCTAVE), [0.0]])
"""The float64 factor of each code, computed once here and copied to every device (the same bits everywhere)."""


def code_scales(scales: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """8-bit codes of a (rows, m) float32 array of block scales, each row against its largest scale.

    1. ref_r = max_b scales[r, b] (float32; travels as 4 bytes in front of the row's codes).
    2. The row's values v_k = float32(float64(ref_r) * SCALE_STEPS[k]), non-increasing in k.
    3. code[r, b] = the k whose v_k is nearest to scales[r, b], differences in float64
       (exact): with i the first index of the ascending v where v >= s, k_hi = 255 - i
       (v >= s) and k_lo = k_hi + 1 (v < s); k_hi when v[k_hi] - s <= s - v[k_lo];
       a scale of 0 below every nonzero value (i = 0) takes code 255.
    4. The decoded scale is v[code]: what every rank uses, the encoder's error included.

    Returns (refs float32 (rows,), codes uint8 (rows, m), decoded float32 (rows, m)).
    """
    scales = np.asarray(scales, dtype=np.float32)
    rows, m = scales.shape
    refs = scales.max(axis=1) if m else np.zeros(rows, np.float32)
    codes = np.empty((rows, m), np.uint8)
    decoded = np.empty((rows, m), np.float32)
    for r in range(rows):
        values = (np.float64(refs[r]) * SCALE_STEPS).astype(np.float32)
        ascending = values[::-1]
        for b, s in enumerate(scales[r]):
            i = int(np.searchsorted(ascending, s, side="left"))
            if i == 0:
                k = 255
            else:
                hi = 255 - i
                k = hi if np.float64(values[hi]) - s <= np.float64(s) - values[hi + 1] else hi + 1
            codes[r, b] = k
            decoded[r, b] = values[k]
    return refs, codes, decoded


def padded_numel(numel: int, world_size: int) -> int:
    """Smallest length the 1-bit path accepts: ``numel`` rounded up to a multiple of 8 * world_size.

    The worker error buffer has this length, the server error buffer 1/world_size of it.
    """
    if numel < 0 or world_size < 1:
        raise ValueError(f"padded_numel needs numel >= 0 and world_size >= 1, got {numel}, {world_size}")
    unit = 8 * world_size
    return -(-numel // unit) * unit


def check_block_size(what: str, block_size: int | None) -> None:
    """``block_size`` is None (one scale per chunk) or a power of two from 8 to ``BLOCK`` (one scale per block)."""
    if block_size is not None and (isinstance(block_size, bool) or not isinstance(block_size, int)
                                   or block_size < 8 or block_size > BLOCK or block_size & (block_size - 1)):
        raise ValueError(f"{what}: block_size must be None (one scale per chunk) or a power of two from 8 to "
                         f"{BLOCK}, got {block_size!r}")


LEVEL_BITS = (1, 2, 3, 4, 8)
"""Bits per element of the reduce-scatter's codecs: 1, signs with block scales; 2-8, uniform levels (``level_step``)."""


def check_bits(what: str, bits: int) -> None:
    """``bits`` is one of ``LEVEL_BITS``."""
    if isinstance(bits, bool) or bits not in LEVEL_BITS:
        raise ValueError(f"{what}: bits must be one of {LEVEL_BITS}, got {bits!r}")


LEVEL_FACTORS = np.array([0.0] + [2.0 ** (1 / 16) * 2.0 / ((1 << bits) - 1) for bits in range(1, 9)], np.float32)
"""``level_step``'s factor float32(2^(1/16) * 2 / (2^bits - 1)) by ``bits`` (entry 0 unused), computed once on the
host: the kernels that code level steps read it from here, so no device computes a power of its own."""


def level_step(absmax: np.ndarray, bits: int) -> np.ndarray:
    """The step of ``bits``-bit uniform levels over blocks whose largest |x| is ``absmax``: float32(absmax *
    float32(2^(1/16) * 2 / (2^bits - 1))) (``LEVEL_FACTORS``), one rounding. The 2^bits levels
    (c - (2^bits - 1) / 2) * step, c = 0 .. 2^bits - 1, span [-absmax, absmax] with half a scale code
    (``code_scales``: 2^(1/8) apart) to spare, so that the coded step, within half a code of this one, still reaches
    the block's largest."""
    return (np.asarray(absmax, dtype=np.float32) * LEVEL_FACTORS[bits]).astype(np.float32)


def block_lengths(row_len: int, block_size: int) -> np.ndarray:
    """The lengths of the blocks of one wire row of ``row_len`` elements: blocks of ``block_size`` from the row's
    start, the last one shorter where block_size does not divide row_len."""
    count = -(-row_len // block_size)
    lengths = np.full(count, block_size, dtype=np.int64)
    if count:
        lengths[-1] = row_len - (count - 1) * block_size
    return lengths


def block_scales_from(totals: np.ndarray, lengths: np.ndarray, scale: str) -> np.ndarray:
    """The float32 scales of blocks of ``lengths`` elements from their float64 sums of |x|^p.

    1. "l2": sqrt(total) / sqrt(d); "l1": total / d; in float64 (IEEE, correctly rounded), d the block's length.
    2. Round to float32.
    """
    totals = np.asarray(totals, dtype=np.float64)
    d = np.asarray(lengths, dtype=np.float64)
    values = np.sqrt(totals) / np.sqrt(d) if scale == "l2" else totals / d
    return values.astype(np.float32)


def mix64(z: np.ndarray | int) -> np.ndarray | int:
    """SplitMix64's finalizer on uint64 values (arithmetic modulo 2^64): an array of them, or one Python int (the
    same bits in int arithmetic: ``stream_key`` takes 1.4 us so, 19 us through one-element arrays)."""
    if isinstance(z, int):
        z = ((z ^ (z >> 30)) * MIX1) & MASK64
        z = ((z ^ (z >> 27)) * MIX2) & MASK64
        return z ^ (z >> 31)
    z = np.asarray(z, dtype=np.uint64)
    z = (z ^ (z >> np.uint64(30))) * np.uint64(MIX1)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(MIX2)
    return z ^ (z >> np.uint64(31))


def stream_key(seed: int, step: int, stage: int, rank: int) -> int:
    """The 64-bit key of one rank's random stream in one stage of one call.

    1. k = 0.
    2. For each of (seed, step, stage, rank), taken modulo 2^64: k = mix64((k ^ part) + GOLDEN).
    """
    key = 0
    for part in (seed, step, stage, rank):
        key = mix64(((key ^ (int(part) & MASK64)) + GOLDEN) & MASK64)
    return key
