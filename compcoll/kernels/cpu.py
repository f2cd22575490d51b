"""Fused Numba CPU kernels for the low-bit codecs; bit-identical to ``kernels.reference``.

Every kernel works on numpy arrays (zero-copy views of torch CPU tensors). A 16-bit input
(float16 / bfloat16) arrives as its raw uint16 bits together with a 65536-entry float32
lookup table (exact conversion); a float32 input arrives with ``lut=None``, and Numba
compiles that case without the lookup. Sums of squares follow the reference's order
(``LANES`` lanes per ``BLOCK``-element block, then a pairwise tree), so results do not
depend on the number of threads.

Unless ``NUMBA_THREADING_LAYER`` says otherwise, the kernels run on Numba's own
"workqueue" threads: with the OpenMP layer, torchrun jobs that also hold torch's OpenMP
runtime aborted at exit now and then ("terminate called without an active exception";
3 of 40 runs of examples/train.py, none of 32 with workqueue). Inputs below
``SERIAL_BELOW`` elements run a serial twin of each kernel instead. Workqueue must not be
entered by two threads at once, so ``codecs`` calls these kernels under one process-wide
lock. The kernels release the GIL (``nogil``): while one runs on a communicator's
ordering thread, the caller's Python and torch work go on.
"""

from __future__ import annotations

import os
import types

import numba
import numpy as np
from numba import njit, prange

from . import scalar
from ..spec import BLOCK, LANES, SCALE_BYTES


if "NUMBA_THREADING_LAYER" not in os.environ:
    numba.config.THREADING_LAYER = "workqueue"

SERIAL_BELOW = 1 << 16
"""Inputs of fewer elements run the serial twin of a kernel: starting Numba's threads costs
about 0.2 ms a call, more than the whole work of a 4 KB tensor."""
SERIAL: dict[str, object] = {}
"""Each threaded kernel's serial twin (the same function, its prange run as range), by name."""


def _threaded(fn):
    """Compile ``fn`` threaded over its blocks, and its serial twin into ``SERIAL``.

    The twin is a copy of ``fn`` under another qualified name: Numba's on-disk cache names
    its files after the function and keys their entries by signature alone, so two
    dispatchers of one function would overwrite each other's entries, and a later process
    would load the threaded code for both (or the serial code for both).
    """
    twin = types.FunctionType(fn.__code__, fn.__globals__, fn.__name__ + "_serial", fn.__defaults__)
    twin.__qualname__ = fn.__qualname__ + "_serial"
    SERIAL[fn.__name__] = njit(cache=True, nogil=True)(twin)
    return njit(parallel=True, cache=True, nogil=True)(fn)


_load = njit(cache=True, inline="always")(scalar.load)
_power = njit(cache=True, inline="always")(scalar.power)
_threshold = njit(cache=True, inline="always")(scalar.threshold)
_block_scale = njit(cache=True, inline="always")(scalar.block_scale)
_nearest_code = njit(cache=True, inline="always")(scalar.nearest_code)


@njit(cache=True, nogil=True)
def tree_sum(values):
    """Pairwise tree sum of float64 values (see ``reference.tree_sum``).

    1. Copy into a zero-padded power-of-two buffer.
    2. Halve it in place, v[i] += v[i + half], until one value is left.
    """
    size = 1
    while size < values.size:
        size *= 2
    v = np.zeros(size, np.float64)
    v[: values.size] = values
    while size > 1:
        size //= 2
        for i in range(size):
            v[i] += v[i + size]
    return v[0]


@_threaded
def compensated_power_sum(src, lut, err, n_src, power):
    """Sum of |x|^power (power 2: squares, 1: absolute values) of x = err + src (src zero beyond n_src), writing nothing.

    1. Each block of BLOCK elements keeps LANES float64 accumulators; element
       i adds |float64(x_i)|^power to lane i % LANES, in order.
    2. The block-major lane sums are combined by ``tree_sum``.
    Whole rows of LANES elements run through a loop over the lanes whose bound is read from
    the accumulator row (so LLVM vectorizes it instead of unrolling it into scalar code);
    the rest of a block (past n_src or the end) runs element by element.

    Returns the float64 sum; it is not finite when any x_i is not.
    """
    n = err.size
    nblocks = max(1, (n + BLOCK - 1) // BLOCK)
    partial = np.zeros((nblocks, LANES), np.float64)
    for b in prange(nblocks):
        lo = b * BLOCK
        count = max(0, min(BLOCK, n - lo))
        valid = min(count, max(0, n_src - lo))
        errs = err[lo:lo + count]
        values = src[lo:lo + valid]
        acc = partial[b]
        lanes = acc.size
        rows = valid // lanes
        for k in range(rows):
            first = k * lanes
            for lane in range(lanes):
                acc[lane] += _power(np.float64(errs[first + lane] + _load(values, lut, first + lane)), power)
        for i in range(rows * lanes, count):
            x = np.float64(errs[i] + _load(values, lut, i) if i < valid else errs[i])
            acc[i % lanes] += _power(x, power)
    return tree_sum(partial.reshape(-1))


@_threaded
def segment_sumsq(x, bounds, firsts, blocks, out):
    """out[j] <- ``compensated_power_sum``'s sum of squares of x[bounds[j]:bounds[j + 1]] alone (its bits), every
    segment in one call.

    1. Every summation block q of every segment (``firsts``: segment j's blocks are q in
       [firsts[j], firsts[j + 1]), at least one, ``blocks`` in all) keeps LANES float64
       accumulators; element i of the block adds float64(x_i)^2 to lane i % LANES, in order.
    2. Each segment's block-major lane sums are combined by ``tree_sum``.
    """
    partial = np.zeros((blocks, LANES), np.float64)
    for q in prange(blocks):
        j = np.searchsorted(firsts, q, side="right") - 1
        lo = bounds[j] + (q - firsts[j]) * BLOCK
        count = max(0, min(BLOCK, bounds[j + 1] - lo))
        acc = partial[q]
        lanes = acc.size
        rows = count // lanes
        for k in range(rows):
            first = lo + k * lanes
            for lane in range(lanes):
                acc[lane] += _power(np.float64(x[first + lane]), 2)
        for i in range(rows * lanes, count):
            acc[i % lanes] += _power(np.float64(x[lo + i]), 2)
    for j in prange(out.size):
        out[j] = tree_sum(partial[firsts[j]:firsts[j + 1]].reshape(-1))


GATHER = np.uint64(0x8040201008040201)
"""Times the 8 flag bytes (0/1) of a little-endian uint64, it puts flag j at bit 63 - j and nothing
else at bits 56-63: the top byte is the 8 flags packed, the first in the most significant bit."""
SPREAD = np.uint64(0x0101010101010101)
"""Times a byte, it copies the byte into all 8 bytes of a uint64."""
SELECT = np.uint64(0x0102040810204080)
"""Masks byte j of a spread byte down to its bit 7 - j: nonzero exactly where element j's sign bit is set."""
_TOP = np.uint64(56)


@njit(cache=True, inline="always")
def _pack(flags, out):
    """out[k] <- flags[8k .. 8k+7] (bytes 0/1), the first in the most significant bit: one multiply per byte (``GATHER``)."""
    words = flags.view(np.uint64)
    for k in range(out.size):
        out[k] = np.uint8((words[k] * GATHER) >> _TOP)


@njit(cache=True, inline="always")
def _unpack(bits, flags):
    """flags[8k + j] <- nonzero where bit 7 - j of bits[k] is set, else 0 (``SPREAD``, ``SELECT``); flags holds >= 8 * bits.size."""
    words = flags.view(np.uint64)
    for k in range(bits.size):
        words[k] = (np.uint64(bits[k]) * SPREAD) & SELECT


@_threaded
def compensate_encode(src, lut, err, n_src, scale, bits):
    """Compensate, take signs, pack them and update the error, in one pass.

    For every element i (src zero beyond n_src; err.size is a multiple of 8):
    1. x = err[i] + src[i] in float32.
    2. bit = x >= 0 (sign(0) = +1); bits[i // 8] has element i at bit 7 - i % 8.
    3. err[i] = x - scale * (+1 if bit else -1).
    Each block writes its bits as bytes 0/1 in zero-based loops (vectorized), then packs them.
    """
    nbytes = err.size // 8
    per_block = BLOCK // 8
    nblocks = (nbytes + per_block - 1) // per_block
    for b in prange(nblocks):
        lo = b * per_block
        hi = min(nbytes, lo + per_block)
        first = lo * 8
        count = (hi - lo) * 8
        valid = min(count, max(0, n_src - first))
        errs = err[first:first + count]
        values = src[first:first + valid]
        flags = np.empty(count, np.uint8)
        for e in range(valid):
            x = errs[e] + _load(values, lut, e)
            flags[e] = x >= 0
            errs[e] = x - scale if x >= 0 else x + scale
        tail_errs, tail_flags = errs[valid:], flags[valid:]
        for e in range(count - valid):
            x = tail_errs[e]
            tail_flags[e] = x >= 0
            tail_errs[e] = x - scale if x >= 0 else x + scale
        _pack(flags, bits[lo:hi])


@_threaded
def accumulate_lanes(bits, weights, base, out, n_out, lanes, power):
    """out = sum_r weights[r] * signs(bits[r]) (+ base); ``lanes`` <- the lane sums of its |out|^power.

    ``bits`` is (n, nbytes): row r holds the packed signs of the same n_out elements
    from rank r. ``base`` is None or a float32 vector added after the rank sum (it may
    be ``out`` itself, for an in-place update).
    1. For each element, acc = 0; for r in rank order acc += weights[r] * sign (float32;
       the product is exact, so this is acc +- weights[r]).
    2. out[i] = acc + base[i] (or acc).
    3. |out|^power summed per (block, lane) in the order of ``compensated_power_sum``,
       into ``lanes`` (nblocks * LANES float64, block-major): ``tree_sum(lanes)`` is the
       whole sum, and the lanes of BLOCK-aligned pieces concatenate.
    Each block unpacks rank after rank's bytes into flags (``_unpack``) and adds +-weight
    over all its elements; these loops, the base and the powers (lanes bounded as in
    ``compensated_power_sum``) are elementwise, so LLVM vectorizes them.
    """
    nranks = bits.shape[0]
    nblocks = max(1, (n_out + BLOCK - 1) // BLOCK)
    partial = lanes.reshape(nblocks, LANES)
    partial[:] = 0.0
    for b in prange(nblocks):
        lo = b * BLOCK
        count = max(0, min(BLOCK, n_out - lo))
        block_out = out[lo:lo + count]
        flags = np.empty(BLOCK, np.uint8)
        acc = np.zeros(count, np.float32)
        for r in range(nranks):
            w = weights[r]
            _unpack(bits[r, lo // 8:(lo + count + 7) // 8], flags)
            for e in range(count):
                acc[e] += w if flags[e] else -w
        if base is not None:
            block_base = base[lo:lo + count]
            for e in range(count):
                acc[e] = acc[e] + block_base[e]
        for e in range(count):
            block_out[e] = acc[e]
        sums = partial[b]
        width = sums.size
        rows = count // width
        for k in range(rows):
            for lane in range(width):
                sums[lane] += _power(np.float64(acc[k * width + lane]), power)
        for e in range(rows * width, count):
            sums[e - rows * width] += _power(np.float64(acc[e]), power)


_accumulate_lanes_serial = SERIAL["accumulate_lanes"]


@njit(cache=True, nogil=True)
def accumulate_signs(bits, weights, base, out, n_out, power):
    """``accumulate_lanes``, then the sum of |out|^power: ``tree_sum`` of the lanes."""
    lanes = np.empty(max(1, (n_out + BLOCK - 1) // BLOCK) * LANES, np.float64)
    accumulate_lanes(bits, weights, base, out, n_out, lanes, power)
    return tree_sum(lanes)


@njit(cache=True, nogil=True)
def _accumulate_signs_serial(bits, weights, base, out, n_out, power):
    """``accumulate_signs`` on the serial twin of ``accumulate_lanes``."""
    lanes = np.empty(max(1, (n_out + BLOCK - 1) // BLOCK) * LANES, np.float64)
    _accumulate_lanes_serial(bits, weights, base, out, n_out, lanes, power)
    return tree_sum(lanes)


SERIAL["accumulate_signs"] = _accumulate_signs_serial
SERIAL["tree_sum"] = tree_sum



@njit(cache=True, inline="always")
def _segment_task(t, tasks_per_segment, length, n_out):
    """Task t of segments of ``length`` elements laid end to end, ``tasks_per_segment`` tasks of up to BLOCK elements
    each: its segment, its first element in the segment and in the whole, and its count (cut at n_out: <= 0 past
    it)."""
    segment = t // tasks_per_segment
    lo = (t % tasks_per_segment) * BLOCK
    first = segment * length + lo
    return segment, lo, first, min(BLOCK, length - lo, n_out - first)


@_threaded
def accumulate_groups(bits, weights, out, n_out):
    """out[j * seg + t] = sum_r weights[j, r] * signs(bits[j * m + r])[t], rank by rank in float32 from 0, for
    j * seg + t < n_out (seg = 8 * row_bytes, m = weights.shape[1]): group j's m rows summed into segment j of
    ``out``, each element as ``accumulate_lanes`` sums it (acc +- w, every product exact). Each task takes up to
    BLOCK elements of one segment."""
    groups, members = weights.shape
    seg = 8 * bits.shape[1]
    tasks_per_group = (seg + BLOCK - 1) // BLOCK
    for t in prange(groups * tasks_per_group):
        j, lo, first, count = _segment_task(t, tasks_per_group, seg, n_out)
        if count > 0:
            flags = np.empty(BLOCK, np.uint8)
            acc = np.zeros(count, np.float32)
            for r in range(members):
                w = weights[j, r]
                _unpack(bits[j * members + r, lo // 8:(lo + count + 7) // 8], flags)
                for e in range(count):
                    acc[e] += w if flags[e] else -w
            for e in range(count):
                out[first + e] = acc[e]


@_threaded
def select_decode(bits, positive, negative, out, n_out):
    """Decode rows of packed signs: out[i] = positive[r] if the bit is set, else negative[r].

    ``bits`` is (n, nbytes): row r holds elements [r * 8 * nbytes, (r + 1) * 8 * nbytes).
    ``positive`` / ``negative`` hold the already rounded output values (+s_r, -s_r) in the
    output's storage type, so a float16 / bfloat16 output is written as raw bits.
    For every block of BLOCK elements of every row, in parallel:
    1. unpack its bytes into flags (``_unpack``);
    2. write the row's positive or negative value for each flag, skipping elements >= n_out
       (an elementwise select, which LLVM vectorizes).
    """
    nranks, nbytes = bits.shape
    per_block = BLOCK // 8
    blocks_per_row = (nbytes + per_block - 1) // per_block
    for t in prange(nranks * blocks_per_row):
        r = t // blocks_per_row
        lo = (t % blocks_per_row) * per_block
        hi = min(nbytes, lo + per_block)
        start = (r * nbytes + lo) * 8
        count = max(0, min((hi - lo) * 8, n_out - start))
        if count:
            pos = positive[r]
            neg = negative[r]
            flags = np.empty(BLOCK, np.uint8)
            _unpack(bits[r, lo:hi], flags)
            dest = out[start:start + count]
            for e in range(count):
                dest[e] = pos if flags[e] else neg


@_threaded
def row_absmax(src, lut, n_src, row_len, out):
    """out[r] = max |x_i| over row r (elements [r * row_len, (r + 1) * row_len)).

    x is src zero-padded beyond n_src. A NaN makes its row's maximum NaN.
    1. Each block of BLOCK elements of a row takes its own maximum, in parallel.
    2. Each row's block maxima are combined in order.
    """
    rows = out.size
    per_row = max(1, (row_len + BLOCK - 1) // BLOCK)
    partial = np.zeros(rows * per_row, np.float32)
    for t in prange(rows * per_row):
        lo = (t // per_row) * row_len + (t % per_row) * BLOCK
        hi = min(min((t // per_row + 1) * row_len, lo + BLOCK), n_src)
        values = src[lo:max(lo, hi)]
        m = np.float32(0)
        for e in range(values.size):
            a = abs(_load(values, lut, e))
            if a > m or a != a:
                m = a
        partial[t] = m
    for r in range(rows):
        m = np.float32(0)
        for t in range(r * per_row, (r + 1) * per_row):
            a = partial[t]
            if a > m or a != a:
                m = a
        out[r] = m


@_threaded
def randomized_encode(src, lut, n_src, scales, key, start, rows):
    """Birder's binary randomization, framed: wire row r holds scales[r] at its head, then row r of x, packed
    (src zero beyond n_src).

    ``rows`` is (n, SCALE_BYTES + row_bytes). For element i of x, in row r = i // (8 * row_bytes):
    1. t = threshold of index start + i in stream ``key``.
    2. The bit is set when float64(x_i) > t * float64(scales[r]) (an exact product).
    Each block first writes its bits as bytes 0/1 in a loop that indexes from zero (so
    that Numba drops negative-index checks and LLVM vectorizes the hash), then packs them.
    """
    n, width = rows.shape
    row_bytes = width - SCALE_BYTES
    head = np.empty(1, np.float32)
    for r in range(n):
        head[0] = scales[r]
        rows[r, :SCALE_BYTES] = head.view(np.uint8)
    per_block = BLOCK // 8
    blocks_per_row = (row_bytes + per_block - 1) // per_block
    for t in prange(n * blocks_per_row):
        r = t // blocks_per_row
        lo = (t % blocks_per_row) * per_block
        hi = min(row_bytes, lo + per_block)
        scale = np.float64(scales[r])
        first = (r * row_bytes + lo) * 8
        count = (hi - lo) * 8
        valid = min(count, max(0, n_src - first))
        values = src[first:first + valid]
        flags = np.empty(count, np.uint8)
        for e in range(valid):
            flags[e] = np.float64(_load(values, lut, e)) > _threshold(key, start + first + e) * scale
        tail_flags = flags[valid:]
        for e in range(count - valid):
            tail_flags[e] = 0.0 > _threshold(key, start + first + valid + e) * scale
        _pack(flags, rows[r, SCALE_BYTES + lo:SCALE_BYTES + hi])


@_threaded
def block_power_sums(src, lut, err, n_src, block, row_len, power, sums):
    """sums[r * m + b] = sum of |x_i|^power over block b of row r, x = err + src (rows of row_len elements).

    A row's blocks are ``block`` elements from its start, m = ceil(row_len / block) of them,
    the last one shorter where needed; src is zero beyond n_src. Each block is summed
    sequentially in float64 (every |x| and square exact), as ``reference.block_sums``;
    blocks in parallel, BLOCK elements' worth of them per task.
    """
    per_row = (row_len + block - 1) // block
    per_task = max(1, BLOCK // block)
    for t in prange((sums.size + per_task - 1) // per_task):
        for b in range(t * per_task, min(sums.size, (t + 1) * per_task)):
            r = b // per_row
            first = r * row_len + (b - r * per_row) * block
            last = min(first + block, (r + 1) * row_len)
            acc = 0.0
            for i in range(first, last):
                x = err[i] + _load(src, lut, i) if i < n_src else err[i]
                acc += _power(np.float64(x), power)
            sums[b] = acc


@_threaded
def encode_blocks(src, lut, err, n_src, scales, block, bits):
    """``compensate_encode`` with one scale per block: err[i] = x - (+-scales[r * m + k // block]).

    ``bits`` is (rows, row_bytes), possibly a strided view (rows behind their scales): row r
    holds elements [r * 8 * row_bytes, (r + 1) * 8 * row_bytes); element k of the row is in
    its block k // block, m = ceil(8 * row_bytes / block) blocks per row. Each task takes up
    to BLOCK elements of one row, writes their bits as bytes 0/1, then packs them.
    """
    rows, row_bytes = bits.shape
    per_row = (8 * row_bytes + block - 1) // block
    per_task = BLOCK // 8
    tasks_per_row = (row_bytes + per_task - 1) // per_task
    for t in prange(rows * tasks_per_row):
        r = t // tasks_per_row
        lo = (t % tasks_per_row) * per_task
        hi = min(row_bytes, lo + per_task)
        first = (r * row_bytes + lo) * 8
        count = (hi - lo) * 8
        flags = np.empty(count, np.uint8)
        for k in range((count + block - 1) // block):
            s = scales[r * per_row + lo * 8 // block + k]
            for e in range(k * block, min(count, (k + 1) * block)):
                i = first + e
                x = err[i] + _load(src, lut, i) if i < n_src else err[i]
                flags[e] = x >= 0
                err[i] = x - s if x >= 0 else x + s
        _pack(flags, bits[r, lo:hi])


@_threaded
def accumulate_blocks(bits, weights, block, base, out, n_out):
    """out = sum_r weights[r, i // block] * signs(bits[r]) (+ base), rank by rank in float32.

    ``bits`` is (n, row_bytes), row r the packed signs of the same n_out elements from rank
    r (possibly a strided view); ``weights`` is (n, blocks); ``base`` as in
    ``accumulate_lanes`` (it may be ``out``). Every product is exact, so each step is
    acc +- w, as ``reference.average_block_signs``.
    """
    nranks = bits.shape[0]
    ntasks = (n_out + BLOCK - 1) // BLOCK
    for t in prange(ntasks):
        lo = t * BLOCK
        count = min(BLOCK, n_out - lo)
        flags = np.empty(BLOCK, np.uint8)
        acc = np.zeros(count, np.float32)
        for r in range(nranks):
            _unpack(bits[r, lo // 8:(lo + count + 7) // 8], flags)
            for k in range((count + block - 1) // block):
                w = weights[r, lo // block + k]
                for e in range(k * block, min(count, (k + 1) * block)):
                    acc[e] += w if flags[e] else -w
        if base is not None:
            block_base = base[lo:lo + count]
            for e in range(count):
                acc[e] = acc[e] + block_base[e]
        block_out = out[lo:lo + count]
        for e in range(count):
            block_out[e] = acc[e]


@_threaded
def average_rows(rows, out):
    """out[i] = (((rows[0, i] + rows[1, i]) + ...) + rows[n - 1, i]) / n in float32, as ``reference.average_rows``.

    For every block of BLOCK elements, in parallel:
    1. add the rows in order into float32 accumulators (one rounding per addition);
    2. divide each by n (IEEE float32 division, correctly rounded).
    """
    n, m = rows.shape
    divisor = np.float32(n)
    for t in prange((m + BLOCK - 1) // BLOCK):
        lo = t * BLOCK
        hi = min(m, lo + BLOCK)
        acc = rows[0, lo:hi].copy()
        for r in range(1, n):
            acc += rows[r, lo:hi]
        out[lo:hi] = acc / divisor


@_threaded
def code_blocks(src, block, row_len, power, steps, rows, decoded):
    """Block scales coded against each row's largest and framed: ``spec.block_scales_from`` of float64 sums of
    |x|^power (or the float32 scales in ``src``, ``power`` 0), then ``spec.code_scales``, in one kernel.

    ``decoded`` is (n, m): row r's m block scales, of blocks of ``block`` elements of a row of ``row_len``
    (the last one shorter where needed); ``rows`` the (n, SCALE_BYTES + m + nbytes) wire rows.
    1. Every block's scale into ``decoded`` (``scalar.block_scale``), in parallel.
    2. Row by row: ref = the row's largest (0 for no blocks), its 4 bytes at the row's head; the
       values float32(float64(ref) * steps[k]); every block's code (``scalar.nearest_code``)
       behind the head, and its decoded value into ``decoded``, in parallel.
    """
    n, m = decoded.shape
    for t in prange(n * m):
        b = t % m
        decoded[t // m, b] = _block_scale(src, t, block if b < m - 1 else row_len - (m - 1) * block, power)
    head = np.empty(1, np.float32)
    for r in range(n):
        head[0] = 0.0
        for b in range(m):
            head[0] = max(head[0], decoded[r, b])
        rows[r, :SCALE_BYTES] = head.view(np.uint8)
        values = (np.float64(head[0]) * steps).astype(np.float32)
        for b in prange(m):
            code = _nearest_code(values, decoded[r, b])
            rows[r, SCALE_BYTES + b] = code
            decoded[r, b] = values[code]


@_threaded
def decode_codes(rows, steps, divisor, decoded):
    """decoded[r, b] = float32(float64(ref_r) * steps[code]) / float32(divisor) for the m codes behind each wire
    row's head (its largest scale's 4 bytes): the refs first, then every code in parallel."""
    n, m = decoded.shape
    by = np.float32(divisor)
    refs = np.empty(n, np.float64)
    head = np.empty(SCALE_BYTES, np.uint8)
    for r in range(n):
        head[:] = rows[r, :SCALE_BYTES]
        refs[r] = head.view(np.float32)[0]
    for t in prange(n * m):
        r = t // m
        decoded[r, t % m] = np.float32(refs[r] * steps[rows[r, SCALE_BYTES + t % m]]) / by


@_threaded
def decode_blocks(bits, scales, block, sign, out, n_out):
    """out[i] = +-scales[r, k // block] for element k of row r of ``bits`` (set bit: +), cut to n_out, on raw bits.

    ``bits`` is (rows, row_bytes) (possibly strided); ``scales`` (rows, 8 * row_bytes / block) and ``out`` hold
    the raw bits of one float dtype (uint32 for float32, uint16 for a 16-bit one), and ``sign`` is its sign bit:
    -s is s with that bit flipped.
    """
    rows, row_bytes = bits.shape
    per_task = BLOCK // 8
    tasks_per_row = (row_bytes + per_task - 1) // per_task
    for t in prange(rows * tasks_per_row):
        r = t // tasks_per_row
        lo = (t % tasks_per_row) * per_task
        hi = min(row_bytes, lo + per_task)
        start = (r * row_bytes + lo) * 8
        count = max(0, min((hi - lo) * 8, n_out - start))
        if count:
            flags = np.empty(BLOCK, np.uint8)
            _unpack(bits[r, lo:hi], flags)
            dest = out[start:start + count]
            for e in range(count):
                s = scales[r, (lo * 8 + e) // block]
                dest[e] = s if flags[e] else s ^ sign


@_threaded
def block_absmax(src, lut, err, n_src, block, row_len, out):
    """out[r * m + b] = max |x| over block b of row r of x = err + src (``block_power_sums``' blocks), float32; NaN
    where the block holds NaN, as ``reference.block_absmax``; blocks in parallel."""
    per_row = (row_len + block - 1) // block
    per_task = max(1, BLOCK // block)
    for t in prange((out.size + per_task - 1) // per_task):
        for b in range(t * per_task, min(out.size, (t + 1) * per_task)):
            r = b // per_row
            first = r * row_len + (b - r * per_row) * block
            last = min(first + block, (r + 1) * row_len)
            top = np.float32(0)
            for i in range(first, last):
                x = err[i] + _load(src, lut, i) if i < n_src else err[i]
                a = abs(np.float32(x))
                if a > top or a != a:
                    top = a
                if top != top:
                    break
            out[b] = top


@njit(cache=True, inline="always")
def _level(x, step, half_range, top):
    """The level of float32 x given its block's step (``reference.level_codes``), and the level's float32 value."""
    t = np.float32(x / step) if step > 0 else np.float32(0)
    c = np.floor(np.float32(t + half_range))
    c = min(max(c, 0.0), top)
    return np.uint8(c), np.float32(np.float64(c - top / 2.0) * np.float64(step))


@_threaded
def encode_levels(src, lut, err, n_src, steps, block, nbits, planes):
    """Levels of x = err + src (``_level``) with the step of element k of row r at steps[r * m + k // block]; err[i]
    = x - value. ``planes`` is (rows, nbits * row_bytes), possibly strided: row r holds 8 * row_bytes elements,
    plane j (bit j of each level) in its bytes [j * row_bytes, (j + 1) * row_bytes), packed as signs are. Each
    task takes up to BLOCK elements of one row."""
    rows = planes.shape[0]
    row_bytes = planes.shape[1] // nbits
    row_len = 8 * row_bytes
    per_row = (row_len + block - 1) // block
    per_task = BLOCK // 8
    tasks_per_row = (row_bytes + per_task - 1) // per_task
    top = np.float64((1 << nbits) - 1)
    half_range = np.float32(1 << (nbits - 1))
    for t in prange(rows * tasks_per_row):
        r = t // tasks_per_row
        lo = (t % tasks_per_row) * per_task
        hi = min(row_bytes, lo + per_task)
        first = (r * row_bytes + lo) * 8
        count = (hi - lo) * 8
        codes = np.empty(count, np.uint8)
        flags = np.empty(count, np.uint8)
        for e in range(count):
            i = first + e
            step = steps[r * per_row + (lo * 8 + e) // block]
            x = err[i] + _load(src, lut, i) if i < n_src else err[i]
            c, value = _level(np.float32(x), step, half_range, top)
            codes[e] = c
            err[i] = x - value
        for j in range(nbits):
            for e in range(count):
                flags[e] = (codes[e] >> j) & 1
            _pack(flags, planes[r, j * row_bytes + lo:j * row_bytes + hi])


@njit(cache=True, inline="always")
def _unpack_codes(planes, r, row_bytes, lo, count, nbits, flags, codes):
    """codes[:count] <- the levels of elements lo .. lo + count of row r of bit planes (``encode_levels``' layout),
    through ``flags`` (BLOCK bytes)."""
    codes[:count] = 0
    for j in range(nbits):
        _unpack(planes[r, j * row_bytes + lo // 8:j * row_bytes + (lo + count + 7) // 8], flags)
        for e in range(count):
            if flags[e]:
                codes[e] |= 1 << j


@_threaded
def accumulate_levels(planes, weights, block, nbits, out, n_out):
    """out = sum_r float32(float64(level_r - (2^nbits - 1) / 2) * float64(weights[r, i // block])), rank by rank in
    float32, as ``reference.compressed_reduce_scatter``; ``planes`` is (n, nbits * row_bytes) (``encode_levels``)."""
    nranks = planes.shape[0]
    row_bytes = planes.shape[1] // nbits
    half = ((1 << nbits) - 1) / 2.0
    ntasks = (n_out + BLOCK - 1) // BLOCK
    for t in prange(ntasks):
        lo = t * BLOCK
        count = min(BLOCK, n_out - lo)
        flags = np.empty(BLOCK, np.uint8)
        codes = np.empty(BLOCK, np.int64)
        acc = np.zeros(count, np.float32)
        for r in range(nranks):
            _unpack_codes(planes, r, row_bytes, lo, count, nbits, flags, codes)
            for e in range(count):
                w = np.float64(weights[r, (lo + e) // block])
                acc[e] = acc[e] + np.float32((codes[e] - half) * w)
        block_out = out[lo:lo + count]
        for e in range(count):
            block_out[e] = acc[e]


@_threaded
def decode_levels(planes, steps, block, nbits, out, n_out):
    """out[r * row_len + k] = 0 + float32(float64(level_r[k] - (2^nbits - 1) / 2) * float64(steps[r, k // block])) for
    r * row_len + k < n_out (row_len = 8 * row_bytes): row r's levels into its own segment, each the one term
    ``accumulate_levels`` would sum from 0 (a zero step gives +0, as there); ``planes`` is (n, nbits * row_bytes)
    (``encode_levels``). Each task takes up to BLOCK elements of one row."""
    rows = planes.shape[0]
    row_bytes = planes.shape[1] // nbits
    row_len = 8 * row_bytes
    half = ((1 << nbits) - 1) / 2.0
    tasks_per_row = (row_len + BLOCK - 1) // BLOCK
    for t in prange(rows * tasks_per_row):
        r, lo, first, count = _segment_task(t, tasks_per_row, row_len, n_out)
        if count > 0:
            flags = np.empty(BLOCK, np.uint8)
            codes = np.empty(BLOCK, np.int64)
            _unpack_codes(planes, r, row_bytes, lo, count, nbits, flags, codes)
            for e in range(count):
                w = np.float64(steps[r, (lo + e) // block])
                out[first + e] = np.float32(0) + np.float32((codes[e] - half) * w)
