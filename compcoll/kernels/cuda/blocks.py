"""The block forms' kernels: a scale a block of elements, its sums and maxima, the encode by bit planes, the sums."""

from __future__ import annotations

import math
from functools import lru_cache

import numpy as np
from numba import cuda

from ...spec import LANES, SCALE_BYTES
from ..launch import device_of, launch
from .common import (IN_FLIGHT, LOOKUPS, RAW_TYPES, THREADS, TILE, add_sign, finite_slots, grid_for, row_of, shift_of,
                     stand_in, table_arg, to_power)
from .frames import block_code, coded_scale, row_ref

STAGE = 8
"""Elements of each of a thread block's summation blocks staged per round by the block kernels (their next
``STAGE`` elements, read coalesced into shared memory), which each thread then takes in order: a divisor of
``LANES``, so that a warp's load stages ``LANES // STAGE`` whole blocks' (``_staged_fold``)."""
FOLD_THREADS = THREADS
"""Threads of a block kernel's thread block, a summation block each (at most ``THREADS``; the simulator's checks
take fewer: a Python thread per CUDA thread)."""
_STAGED = (THREADS, STAGE + 1)
"""Shape of the shared array of staged elements: a row per summation block, one column of padding so that a warp's
threads reading their rows' j-th elements touch 32 different banks."""


@cuda.jit(device=True)
def _block_span(b, total, shift, per_row, row_len):
    """(first element, length) of block b of rows of ``row_len`` (``per_row`` blocks a row, of 2^shift elements, the
    last of a row shorter where needed); (0, 0) past the ``total`` blocks."""
    if b >= total:
        return 0, 0
    r = b // per_row
    first = r * row_len + ((b - r * per_row) << shift)
    return first, min(1 << shift, (r + 1) * row_len - first)


def _staged_fold(look_up, raw_type, fold, zero):
    """A kernel out[b] = ``fold`` over block b's elements x = err + src (float32) in order, from ``zero``.

    1. A thread block takes ``FOLD_THREADS`` summation blocks, a thread each (their spans in
       shared memory), each warp those of its own threads.
    2. Round by round their next ``STAGE`` elements are read into shared memory by the warp whose they are, its
       load m reading elements of blocks (32 m + l) // ``STAGE`` of its 32, lane l taking element
       (32 m + l) % ``STAGE`` (at ``STAGE`` 8: 4 blocks' 8 consecutive elements, 4 sectors; a thread reading its own
       block's made a load touch 32 sectors for 32 elements): a thread loads its ``STAGE`` elements (raw source and
       error), then looks the 16-bit sources up and adds, then stores them (each element's loads behind the previous
       one's store waited a memory round trip an element). The blocks a load reads sit a constant distance apart
       in the warp's part of the spans and of the staging rows, so every load's span and store address is one
       register and a constant offset (the thread block's rows, ``blockDim`` apart, made the compiler keep 16
       addresses in registers: 136 of them).
    3. Each thread folds its block's staged elements in order: the order and the bits are one
       element at a time's.
    4. finite[0] <- 0.0 where every out[b] is finite, else NaN (what the call's agreement reads: the host's
       ``codecs.dispatch.flag_finite``'s values), in the same launch: thread 0 of a thread block where a thread wrote a
       non-finite value (``syncthreads_or``) adds 1 to counts[1]; thread 0 of each fences (the flag's add before the
       count) and counts its block in counts[0]; the block that counts last zeroes the count, fences, and takes
       counts[1], zeroing it (one atomic exchange), for the stream's next launch. A torch sum over ``out`` did this
       after the launch: a torch operator more a call.
    """

    @cuda.jit
    def kernel(src, lut, err, n_src, shift, row_len, out, counts, finite):
        staged = cuda.shared.array(_STAGED, np.float32)
        raw = cuda.local.array(STAGE, raw_type)
        held = cuda.local.array(STAGE, np.float32)
        firsts = cuda.shared.array(THREADS, np.int64)
        lengths = cuda.shared.array(THREADS, np.int64)
        lane = cuda.threadIdx.x
        width = cuda.blockDim.x
        in_warp = lane & (LANES - 1)
        j = in_warp % STAGE
        ahead = lane - in_warp + in_warp // STAGE
        their_firsts = firsts[ahead:]
        their_lengths = lengths[ahead:]
        their_rows = staged[ahead:]
        per_row = (row_len + (1 << shift) - 1) >> shift
        total = out.size
        nonfinite = 0
        for group in range(cuda.blockIdx.x, -(-total // width), cuda.gridDim.x):
            b = group * width + lane
            first, length = _block_span(b, total, shift, per_row, row_len)
            firsts[lane] = first
            lengths[lane] = length
            cuda.syncthreads()
            acc = zero
            for start in range(0, 1 << shift, STAGE):
                for m in range(STAGE):
                    t = m * (LANES // STAGE)
                    i = their_firsts[t] + start + j
                    taken = start + j < their_lengths[t]
                    raw[m] = src[i] if taken and i < n_src else 0
                    held[m] = err[i] if taken else np.float32(0)
                for m in range(STAGE):
                    if their_firsts[m * (LANES // STAGE)] + start + j < n_src:
                        held[m] = held[m] + look_up(lut, raw[m])
                for m in range(STAGE):
                    t = m * (LANES // STAGE)
                    if start + j < their_lengths[t]:
                        their_rows[t, j] = held[m]
                cuda.syncthreads()
                for k in range(STAGE):
                    if start + k < length:
                        acc = fold(acc, staged[lane, k])
                cuda.syncthreads()
            if b < total:
                out[b] = acc
                if not math.isfinite(acc):
                    nonfinite = 1
        if cuda.syncthreads_or(nonfinite) != 0 and lane == 0:
            cuda.threadfence()
            cuda.atomic.add(counts, 1, 1)
        if lane == 0:
            cuda.threadfence()
            if cuda.atomic.add(counts, 0, 1) == cuda.gridDim.x - 1:
                counts[0] = 0
                cuda.threadfence()
                finite[0] = math.nan if cuda.atomic.exch(counts, 1, 0) != 0 else 0.0

    return kernel


@cuda.jit(device=True)
def _larger_magnitude(top, x):
    """max(top, |x|), NaN kept once seen (``top``'s order of a block's elements, as the CPU kernel)."""
    a = abs(x)
    return a if a > top or a != a else top


@lru_cache(maxsize=None)
def _block_power_sums(with_lut: bool, p: int):
    """sums[b] = sum over block b's elements, in order, of |float64(x)|^p (``_staged_fold``)."""
    @cuda.jit(device=True)
    def add_power(acc, x):
        return acc + to_power(np.float64(x), p)

    return _staged_fold(LOOKUPS[with_lut], RAW_TYPES[with_lut], add_power, 0.0)


def block_power_sums(src, lut, err, n_src, block, row_len, power, sums, stream=0, finite=None) -> None:
    """sums[r * m + b] = sum of |x|^power over block b of row r of x = err + src, sequentially in float64, as the
    CPU kernel: a thread per block, its elements staged in shared memory (``_staged_fold``); and finite[0] (a
    float64, where given) <- 0.0 where every sum is finite, else NaN."""
    launch(_block_power_sums(lut is not None, int(power)), grid_for(sums.size, FOLD_THREADS), FOLD_THREADS, stream,
           src, table_arg(lut, stream), err, n_src, shift_of(block), row_len, sums, *finite_slots(stream, finite))


def tiled_block_encoder(look_up, raw_type, code_of, one_plane: bool):
    """A kernel coding x = err + src element by element with its block's value (a scale, or a level step) and
    packing the codes' ``nbits`` bit planes into (rows, nbits * row_bytes) ``planes``, tiled as
    ``signs.compensate_encode``; ``raw_type`` is the source's element type as loaded (``common.RAW_TYPES``).

    1. A block takes a tile of ``TILE`` elements: thread l loads elements l, l + THREADS, ... (their raw
       source, error and block value), all 8 before it uses any, then looks their sources up and adds the errors,
       then codes them (coalesced reads and writes; ``code_of``: the code and the new error), keeping the codes in
       shared memory. One element at a time, each element's loads waited behind the previous element's store of
       its error: a memory round trip an element.
    2. Thread l packs byte l of the tile from elements 8l..8l+7 into each plane, the ``nbits``
       plane bytes in one 64-bit register (byte j: plane j), not a local array, which a plane
       index known only at run time would put in local memory.
    A tile inside one row and inside the source (in a row of many tiles, all but the two at its ends) loads its
    elements at constant offsets from the thread's first, with no check and no row walk; another checks each
    element's bounds and walks the rows. A thread keeps the row of its last element (and of its last byte) and
    divides only when it leaves it; an element's block is a shift. ``one_plane``: ``nbits`` is 1, known
    when compiled. (Until 2026-12-05 every tile walked: about 40 instructions an element's loads in the sm_90
    machine code, its bounds checks, row test and index fix-ups, between one element's loads and the next's.)
    """

    @cuda.jit
    def kernel(src, lut, err, n_src, values, shift, nbits, planes):
        codes = cuda.shared.array(TILE, np.uint8)
        raw = cuda.local.array(8, raw_type)
        held = cuda.local.array(8, np.float32)
        value = cuda.local.array(8, np.float32)
        lane = cuda.threadIdx.x
        count = 1 if one_plane else nbits
        rows = planes.shape[0]
        row_bytes = planes.shape[1] // count
        row_len = 8 * row_bytes
        total = rows * row_bytes
        per_row = (row_len + (1 << shift) - 1) >> shift
        r, first = 0, 0
        byte_row, first_byte = 0, 0
        for tile in range(cuda.blockIdx.x, -(-total // THREADS), cuda.gridDim.x):
            base = tile * TILE
            r, first = row_of(base, r, first, row_len)
            whole = base + TILE <= min(n_src, first + row_len)
            src_at = src[base + lane:]
            err_at = err[base + lane:]
            if whole:
                row_values = values[r * per_row:]
                for m in range(8):
                    raw[m] = src_at[m * THREADS]
                    held[m] = err_at[m * THREADS]
                    value[m] = row_values[(base + m * THREADS + lane - first) >> shift]
            else:
                for m in range(8):
                    i = base + m * THREADS + lane
                    if i < total * 8:
                        r, first = row_of(i, r, first, row_len)
                        raw[m] = src_at[m * THREADS] if i < n_src else 0
                        held[m] = err_at[m * THREADS]
                        value[m] = values[r * per_row + ((i - first) >> shift)]
            for m in range(8):
                if whole or base + m * THREADS + lane < n_src:
                    held[m] = np.float32(held[m] + look_up(lut, raw[m]))
            for m in range(8):
                if whole or base + m * THREADS + lane < total * 8:
                    code, left = code_of(held[m], value[m], nbits)
                    err_at[m * THREADS] = left
                    codes[m * THREADS + lane] = code
            cuda.syncthreads()
            t = tile * THREADS + lane
            if t < total:
                byte_row, first_byte = row_of(t, byte_row, first_byte, row_bytes)
                packed = np.uint64(0)
                for e in range(8):
                    code = np.uint64(codes[8 * lane + e])
                    for j in range(count):
                        packed |= ((code >> np.uint64(j)) & np.uint64(1)) << np.uint64(8 * j + 7 - e)
                for j in range(count):
                    planes[byte_row, j * row_bytes + t - first_byte] = (packed >> np.uint64(8 * j)) & np.uint64(255)
            cuda.syncthreads()

    return kernel


@cuda.jit(device=True)
def _sign_code(x, scale, nbits):
    """1 bit: (1, x - scale) where x >= 0, else (0, x + scale), in float32, as ``signs.compensate_encode``."""
    if x >= 0:
        return np.uint8(1), x - scale
    return np.uint8(0), x + scale


@lru_cache(maxsize=None)
def _encode_blocks(with_lut: bool):
    return tiled_block_encoder(LOOKUPS[with_lut], RAW_TYPES[with_lut], _sign_code, True)


def encode_blocks(src, lut, err, n_src, scales, block, bits, stream=0) -> None:
    """``signs.compensate_encode`` with the scale of element k of row r at scales[r * m + k // block], into (rows,
    row_bytes) ``bits`` (possibly strided), as the CPU kernel: ``tiled_block_encoder`` with one bit plane."""
    launch(_encode_blocks(lut is not None), grid_for(bits.shape[0] * bits.shape[1]), THREADS, stream,
           src, table_arg(lut, stream), err, n_src, scales, shift_of(block), 1, bits)


@cuda.jit(device=True)
def _no_ref(weights, r, head):
    """A weight table's stand-in for a row's head (``rank_accumulator``'s given weights have none)."""
    return 0.0


@cuda.jit(device=True)
def _no_code(weights, r, b):
    """The stand-in for a block's code where the weights are not coded (a table's, a head's)."""
    return 0


@cuda.jit(device=True)
def _given_weight(weights, r, b, ref, steps, by, code):
    """Block b's weight in row r of a float32 weight table, as given."""
    return weights[r, b]


@cuda.jit(device=True)
def _coded_weight(rows, r, b, ref, steps, by, code):
    """The weight of block b of wire row r, of head ``ref`` (``frames.row_ref``) and block ``code``
    (``frames.block_code``): its decoded scale (``frames.coded_scale``) / ``by``, in float32 (IEEE division, as
    ``decode_codes``)."""
    return coded_scale(ref, steps, code) / by


@cuda.jit(device=True)
def _head_weight(rows, r, b, ref, steps, by, code):
    """Wire row r's weight, its head ``ref`` itself / ``by``, in float32 (IEEE division, as
    ``frames.head_weights``); every block's the same."""
    return np.float32(ref) / by


WEIGHTS = {"table": (_no_ref, _no_code, _given_weight), "codes": (row_ref, block_code, _coded_weight),
           "heads": (row_ref, _no_code, _head_weight)}
"""Where a ``rank_accumulator`` kernel takes its weights: a float32 table; wire rows' heads and block codes (the
block forms' frames); wire rows' heads alone (the 1-bit frames: a scale a row). Each: (the row's head, block b's
code, the weight of block b from them)."""


def rank_accumulator(code_of, add_code, with_base: bool, weights_from: str = "table"):
    """A kernel out[i] = ``add_code`` over ranks r in order, from float32 0, of element i's code in row r of
    ``rows`` and its block's weight w[r, i >> shift] (+ base[i]), in float32.

    The weights (``WEIGHTS[weights_from]``) are ``weights``, a float32 table, or are decoded in the launch from
    the wire rows ``weights`` whose payload ``rows`` is: with "codes", float32(float64(ref_r) * steps[code]) /
    float32(divisor), ref_r row r's head, code its block's byte behind it (``decode_codes``' bits, where a launch
    of it wrote the table first); with "heads", ref_r / float32(divisor) (``frames.head_weights``' bits).

    A thread block takes ``IN_FLIGHT`` x ``THREADS`` neighbouring elements a round, its thread l elements l,
    l + ``THREADS``, ... (neighbouring threads, neighbouring elements), so that a thread's loads are in flight
    together (a thread on one element at a time waited a whole memory round trip an element, its next loads held
    behind its store: numba's arrays may alias) and sit a constant distance apart, folded into the loads and
    stores (elements a grid stride apart kept an address a register: 90-118 registers where this takes 55-64,
    except 80-88 for a table's or heads' weights without a base). A round:
    1. for each rank r in order: (wire rows) read row r's head; load the round's codes (``code_of``: a sign byte,
       or a level from its planes' bytes, ``row_bytes`` a plane; held as a byte each, a level being at most 8
       bits) and, with "codes", their blocks' codes; then the weights of row r (with "codes" each a step looked up
       by its block's code: a load behind a load, so after all the round's first loads), then add each code's value
       to its element's sum (``add_code``);
    2. with a base, load the round's base values, then add each to its sum;
    3. store the sums.
    """
    ref_of, code_of_block, weight_of = WEIGHTS[weights_from]
    coded = weights_from == "codes"

    @cuda.jit
    def kernel(rows, weights, steps, divisor, shift, nbits, base, out, n_out):
        nranks = rows.shape[0]
        row_bytes = rows.shape[1] // nbits
        by = np.float32(divisor)
        acc = cuda.local.array(IN_FLIGHT, np.float32)
        codes = cuda.local.array(IN_FLIGHT, np.uint8)
        scales = cuda.local.array(IN_FLIGHT, np.float32)
        keys = cuda.local.array(IN_FLIGHT, np.uint8)
        head = cuda.local.array(SCALE_BYTES, np.uint8)
        for tile in range(cuda.blockIdx.x, -(-n_out // (IN_FLIGHT * THREADS)), cuda.gridDim.x):
            k = tile * (IN_FLIGHT * THREADS) + cuda.threadIdx.x
            for u in range(IN_FLIGHT):
                acc[u] = np.float32(0)
            for r in range(nranks):
                ref = ref_of(weights, r, head)
                for u in range(IN_FLIGHT):
                    i = k + u * THREADS
                    codes[u] = code_of(rows, r, row_bytes, i, nbits) if i < n_out else 0
                    keys[u] = code_of_block(weights, r, i >> shift) if i < n_out else 0
                    if not coded:
                        scales[u] = weight_of(weights, r, i >> shift, ref, steps, by, 0) if i < n_out else (
                            np.float32(0))
                if coded:
                    for u in range(IN_FLIGHT):
                        i = k + u * THREADS
                        scales[u] = weight_of(weights, r, i >> shift, ref, steps, by, keys[u]) if i < n_out else (
                            np.float32(0))
                for u in range(IN_FLIGHT):
                    acc[u] = add_code(acc[u], codes[u], scales[u], k + u * THREADS, nbits)
            if with_base:
                for u in range(IN_FLIGHT):
                    i = k + u * THREADS
                    scales[u] = base[i] if i < n_out else np.float32(0)
                for u in range(IN_FLIGHT):
                    acc[u] = acc[u] + scales[u]
            for u in range(IN_FLIGHT):
                i = k + u * THREADS
                if i < n_out:
                    out[i] = acc[u]

    return kernel


WHOLE_ROW = 62
"""The shift of ``accumulate_frames``' launch: every element of a row in block 0 (its one weight)."""


def unread_steps(stream) -> object:
    """The steps a ``rank_accumulator`` kernel that decodes no codes takes (unread: a stand-in on the stream's GPU)."""
    return stand_in(device_of(stream), np.float64)


@cuda.jit(device=True)
def _sign_byte(bits, r, row_bytes, i, nbits):
    """The byte of row r of ``bits`` holding element i's sign (``row_bytes`` and ``nbits`` unused)."""
    return bits[r, i >> 3]


@lru_cache(maxsize=None)
def _accumulate_blocks(with_base: bool, weights_from: str):
    """out[i] = sum over ranks r of +-w[r, i >> shift] by bit i of row r, in r order in float32 (+ base[i]):
    ``rank_accumulator`` of sign bytes."""
    return rank_accumulator(_sign_byte, add_sign, with_base, weights_from)


def accumulate_blocks(bits, weights, block, base, out, n_out, stream=0) -> None:
    """out = sum_r weights[r, i // block] * signs(bits[r]) (+ base), rank by rank in float32, as the CPU kernel:
    ``IN_FLIGHT`` elements a thread (i // block a shift), a thread for every ``IN_FLIGHT`` elements (at most
    ``common.MAX_BLOCKS`` blocks)."""
    launch(_accumulate_blocks(base is not None, "table"), grid_for(n_out, IN_FLIGHT * THREADS), THREADS, stream,
           bits, weights, unread_steps(stream), 1, shift_of(block), 1, out if base is None else base, out, n_out)


def accumulate_framed_blocks(bits, rows, steps, divisor, block, base, out, n_out, stream=0) -> None:
    """``accumulate_blocks`` with the weights decoded from the wire ``rows`` (their heads and block codes, divided
    by ``divisor``) in the same launch: the CPU kernels' ``decode_codes`` then ``accumulate_blocks``, in one."""
    launch(_accumulate_blocks(base is not None, "codes"), grid_for(n_out, IN_FLIGHT * THREADS), THREADS, stream,
           bits, rows, steps, divisor, shift_of(block), 1, out if base is None else base, out, n_out)


def accumulate_frames(bits, rows, divisor, base, out, n_out, stream=0) -> None:
    """out = sum_r (s_r / divisor) * signs(bits[r]) (+ base) rank by rank in float32, s_r the scale at the head of
    wire row r (whose payload ``bits`` is): the bits of ``head_weights`` then ``accumulate_signs``' average, in one
    launch (``rank_accumulator`` of sign bytes, every element of a row in one block: ``WHOLE_ROW``), which adds no
    sum of |out|^p."""
    launch(_accumulate_blocks(base is not None, "heads"), grid_for(n_out, IN_FLIGHT * THREADS), THREADS, stream,
           bits, rows, unread_steps(stream), divisor, WHOLE_ROW, 1, out if base is None else base, out, n_out)


@cuda.jit
def _accumulate_groups(bits, weights, out, n_out):
    """out[i] = sum over members r of +-weights[j, r] by bit t of row j * members + r, in r order in float32, for
    element t of segment j: each thread takes ``IN_FLIGHT`` elements a grid stride apart a round, walks their
    segments, then member by member loads their sign bytes and weights before it adds any."""
    members = weights.shape[1]
    seg = bits.shape[1] * 8
    step = cuda.gridsize(1)
    acc = cuda.local.array(IN_FLIGHT, np.float32)
    held = cuda.local.array(IN_FLIGHT, np.uint8)
    scales = cuda.local.array(IN_FLIGHT, np.float32)
    groups = cuda.local.array(IN_FLIGHT, np.int64)
    offsets = cuda.local.array(IN_FLIGHT, np.int64)
    j, first = -1, -seg
    for k in range(cuda.grid(1), n_out, IN_FLIGHT * step):
        for u in range(IN_FLIGHT):
            i = k + u * step
            if i < n_out:
                j, first = row_of(i, j, first, seg)
            groups[u] = j
            offsets[u] = i - first
            acc[u] = np.float32(0)
        for r in range(members):
            for u in range(IN_FLIGHT):
                if k + u * step < n_out:
                    held[u] = bits[groups[u] * members + r, offsets[u] >> 3]
                    scales[u] = weights[groups[u], r]
            for u in range(IN_FLIGHT):
                acc[u] = add_sign(acc[u], held[u], scales[u], offsets[u], 1)
        for u in range(IN_FLIGHT):
            i = k + u * step
            if i < n_out:
                out[i] = acc[u]


def accumulate_groups(bits, weights, out, n_out, stream=0) -> None:
    """Group j's rows into segment j of out, as the CPU kernel: ``IN_FLIGHT`` elements a thread (their groups kept,
    ``row_of``), rank by rank in float32."""
    launch(_accumulate_groups, grid_for(n_out, IN_FLIGHT * THREADS), THREADS, stream, bits, weights, out, n_out)


@lru_cache(maxsize=None)
def _block_absmax(with_lut: bool):
    """out[b] = max |x| over block b's elements (``_staged_fold``)."""
    return _staged_fold(LOOKUPS[with_lut], RAW_TYPES[with_lut], _larger_magnitude, np.float32(0))


def block_absmax(src, lut, err, n_src, block, row_len, out, stream=0, finite=None) -> None:
    """out[r * m + b] = max |x| over block b of row r of x = err + src (NaN where it holds NaN), as the CPU kernel:
    a thread per block, its elements staged in shared memory (``_staged_fold``); and finite[0] (a float64, where
    given) <- 0.0 where every maximum is finite, else NaN."""
    launch(_block_absmax(lut is not None), grid_for(out.size, FOLD_THREADS), FOLD_THREADS, stream,
           src, table_arg(lut, stream), err, n_src, shift_of(block), row_len, out, *finite_slots(stream, finite))
