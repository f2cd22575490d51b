"""Fused numba.cuda kernels for the low-bit codecs, with the CPU kernels' names and results (the reference's bits).

Every function takes device arrays (``kernels.launch.DeviceArray`` views of torch CUDA
tensors, numba device arrays; host numpy arrays under the simulator,
``NUMBA_ENABLE_CUDASIM=1``) and an optional ``stream`` (``numba.cuda.external_stream``
of torch's current stream, so kernels queue behind the work that produced their input).
Every launch and every read back to the host goes through ``kernels.launch``, which counts
them and launches pre-bound variants through cuda.core.
Kernels use grid-stride loops and no warp intrinsics. Sums of squares (or of absolute
values, ``power``) follow the CPU order exactly: lane l of summation block b accumulates
elements b*BLOCK + k*LANES + l for k = 0, 1, ... in float64 (a thread block stages the summation block's elements
in shared memory first, all its threads loading neighbouring elements at once, then ``LANES`` threads add the
lanes), then the block-major lane sums are combined by the
same pairwise tree in the same launch: the grid's last block to finish (an atomic count) adds them, and writes the
sum and, where asked, its float32 scale. Past ``TAIL`` lane sums the last block of each group of blocks first adds
its group's part of the tree's wide levels, and the last group the rest (``_finish_lanes``). Only the final float64
crosses to the host, or none where the caller keeps it on the device (``into``, ``scale``, a scale read
from memory). The encoders read and write elements coalesced and stage a tile's signs in shared memory
before each thread packs one byte; the framed decoders are tiled the other way (a thread unpacks one byte into
shared memory, then the tile is stored coalesced), and ``select_decode`` goes row by row, a thread loading several
elements' sign bytes before it stores them. 16-bit inputs arrive as raw uint16 with the 65536-entry float32
table, as on the CPU. No per-element 64-bit division (dozens of instructions a thread): a block size, a power of
two, is a shift, and a thread walking rows keeps the row of its last element (and a frame's head) and divides (and
reads the head) only when it leaves it. No kernel takes a None argument: each is built per variant (with or without a
table, with or without a base vector, power 1 or 2) and cached.
"""

from __future__ import annotations

import math
from functools import lru_cache

import numpy as np
from numba import cuda

from . import scalar
from ..spec import BLOCK, LANES, SCALE_BYTES
from .launch import device_of, device_zeros, launch, read_first

THREADS = 128
MAX_BLOCKS = 4096
TAIL = 4096
"""Lane sums up to which the last block of the kernel that wrote them adds them all itself (``_finish_sum``); past
it, the width of the tree's level that the last blocks of its ``TAIL // LANES`` groups write (``_finish_lanes``)."""
COLLAPSED = 32768
"""The width ``_collapse`` takes the tree down to before its last block adds the rest."""
COLLAPSE_THREADS = 1024
"""Threads per block of ``_collapse``: its last block adds up to ``COLLAPSED`` values alone."""
LANE_THREADS = 256
"""Threads of a lane-sum kernel's block (a multiple of ``LANES``): together they stage one summation block's
``BLOCK`` elements in shared memory (all their loads in flight at once), then ``LANES`` of them add the lanes in
order."""
IN_FLIGHT = 8
"""Elements a thread loads per round before it uses them: a decoding thread (``_select_row``) before any of them is
stored (the compiler cannot move a load above a store to another array, as numba's arrays may alias, so one element
at a time leaves a single load in flight per thread, each behind the previous element's store); a row maximum's lane
(``_absmax_lanes``) before it compares them in order (the compiler unrolled that loop 4 deep)."""
ACCUMULATED = 4
"""Elements an accumulating thread takes per round (``_accumulate_lanes``), as ``IN_FLIGHT`` for the decoders: 4
keep the kernel at 71-72 registers in the sm_90 build (8 took 96, so that a multiprocessor would hold two of its
blocks, not three)."""
TILE = 8 * THREADS
"""Elements of an encode kernel's tile: a block packs THREADS bytes at a time."""


def _table(lut, stream):
    """The lookup table, or a one-element stand-in on the stream's GPU when there is none (kernels take no None
    arguments)."""
    return _stand_in(device_of(stream), np.float32) if lut is None else lut


def _grid(work: int, per_block: int = THREADS) -> int:
    """Blocks for ``work`` items of a grid-stride loop, ``per_block`` items a block (at most ``MAX_BLOCKS``)."""
    return max(1, min(MAX_BLOCKS, -(-work // per_block)))


@cuda.jit(device=True)
def _row_of(i, row, first, row_len):
    """(row, its first index) of index i of rows of ``row_len``, from the thread's last (row, first): a division only
    where i left that row (a thread's indices only grow)."""
    if i - first >= row_len:
        row = i // row_len
        first = row * row_len
    return row, first


def _shift(block: int) -> int:
    """log2 of a block size, a power of two (``spec.check_block_size``): the kernels shift an element's index by it
    where they would divide by the block size (a 64-bit division takes dozens of instructions a GPU thread)."""
    shift = int(block).bit_length() - 1
    if block != 1 << shift:
        raise ValueError(f"compcoll: block size {block} is not a power of two")
    return shift


def _device_empty(size: int, dtype, stream=0):
    """Default allocator of the kernels' temporaries: numba's own (callers may pass a pooled one)."""
    return cuda.device_array(size, dtype, stream=stream)


_SCALE_LOADS = {False: cuda.jit(device=True)(scalar.scale_value), True: cuda.jit(device=True)(scalar.scale_in_memory)}
_LOOKUPS = {False: cuda.jit(device=True)(scalar.value_of), True: cuda.jit(device=True)(scalar.table_value)}
_threshold = cuda.jit(device=True)(scalar.threshold)
_power = cuda.jit(device=True)(scalar.power)


@cuda.jit(device=True)
def _pack(signs, first):
    """The byte of signs[first:first + 8] (0 or 1 each), the first in the most significant bit."""
    byte = 0
    for j in range(8):
        byte |= signs[first + j] << (7 - j)
    return byte


@cuda.jit(device=True)
def _scale_value(total, d, root_d, l2):
    """The float32 scale of ``d`` elements from their float64 sum of |x|^power, as ``spec.scale_from``."""
    if d == 0:
        return np.float32(0.0)
    if l2:
        return np.float32(math.sqrt(total) / root_d) if total >= 0 else np.float32(math.nan)
    return np.float32(total / d)


@cuda.jit(device=True)
def _last_block(counter, slot, expected):
    """Whether this block is the last of ``expected`` blocks to count in counter[slot], every counted block's global
    writes made visible first.

    The pattern of CUDA's cooperative-groups grid barrier: one fence a block, not one a thread (a fence is
    ``membar.gl``, PTX's ``fence.sc.gpu``: in the sm_90 build ``MEMBAR.SC.GPU`` and an invalidation of the SM's L1,
    run by every warp that reaches it).
    1. The block waits for all its threads' writes (a barrier orders them before thread 0's next steps).
    2. Thread 0 fences (the block's writes, ordered before it by the barrier, are made visible to the GPU with
       it) and counts the block in ``counter[slot]``; the block that counts ``expected``-th is the last, and zeroes
       the count again for the stream's next launch.
    3. There, thread 0 fences again, so that the block's reads after the next barrier see what every other block
       made visible before it counted.
    """
    done = cuda.shared.array(1, np.int32)
    cuda.syncthreads()
    if cuda.threadIdx.x == 0:
        cuda.threadfence()
        last = cuda.atomic.add(counter, slot, 1) == expected - 1
        if last:
            counter[slot] = 0
            cuda.threadfence()
        done[0] = 1 if last else 0
    cuda.syncthreads()
    return done[0] == 1


@cuda.jit(device=True)
def _tree_in_block(values, size):
    """values[0] <- the pairwise tree of values[:size] zero-padded to a power of two, by one block, in place."""
    half = 1
    while 2 * half < size:
        half *= 2
    if size > 1:
        for i in range(cuda.threadIdx.x, half, cuda.blockDim.x):
            values[i] = values[i] + (values[i + half] if i + half < size else 0.0)
        cuda.syncthreads()
        while half > 1:
            half //= 2
            for i in range(cuda.threadIdx.x, half, cuda.blockDim.x):
                values[i] += values[i + half]
            cuda.syncthreads()


@cuda.jit(device=True)
def _finish_sum(values, size, counter, expected, total, d, root_d, mode, scale_out):
    """The last of ``expected`` blocks to count in counter[0]: the tree of values[:size] into total[0], and (mode 1:
    l2, 2: l1) the float32 scale of ``d`` elements from it into scale_out[0]."""
    if _last_block(counter, 0, expected):
        _tree_in_block(values, size)
        if cuda.threadIdx.x == 0:
            t = values[0]
            total[0] = t
            if mode != 0:
                scale_out[0] = _scale_value(t, d, root_d, mode == 1)


@cuda.jit(device=True)
def _strided_tree(partial, i, width):
    """The pairwise tree's value at index i once it is ``width`` wide: the tree of partial[i + m * width], m < M
    (zero past the end, M the padded length over ``width``), whose first level pairs m with m + M/2.

    That is the same tree taken over m in bit-reversed order, adjacent pairs first: the thread walks it with a
    stack of partial trees (a binary counter), one value of ``partial`` at a time.
    """
    n = partial.size
    stride = 1
    while stride * width < n:
        stride *= 2
    levels = 0
    while (1 << levels) < stride:
        levels += 1
    stack = cuda.local.array(64, np.float64)
    for j in range(stride):
        m = 0
        for b in range(levels):
            m |= ((j >> b) & 1) << (levels - 1 - b)
        k = i + m * width
        x = partial[k] if k < n else 0.0
        level = 0
        carry = j
        while carry & 1:
            x = stack[level] + x
            level += 1
            carry >>= 1
        stack[level] = x
    return stack[levels]


@cuda.jit
def _collapse(partial, width, values, counter, total, d, root_d, mode, scale_out):
    """values[i] <- the tree's value at index i once it is ``width`` wide (``_strided_tree``, i < width, neighbouring
    threads on neighbouring i: ``partial`` read coalesced), then ``_finish_sum``."""
    for i in range(cuda.grid(1), width, cuda.gridsize(1)):
        values[i] = _strided_tree(partial, i, width)
    _finish_sum(values, width, counter, cuda.gridDim.x, total, d, root_d, mode, scale_out)


SUBTREES = 8
"""Threads that share one value of a lane-sum kernel's group tree (``_finish_lanes``), each walking every
``SUBTREES``-th of the lane sums under it."""
SUBTREE_VALUES = SUBTREES * LANES
"""A group's values in ``_finish_lanes``' shared memory (numba sizes a shared array by one constant)."""


@cuda.jit(device=True)
def _finish_lanes(partial, groups, counter, total, d, root_d, mode, scale_out):
    """The end of a lane-sum kernel: the pairwise tree of its lane sums partial[:n] into total[0] (and the scale, as
    ``_finish_sum``), by the last blocks to finish, in the same launch.

    1. Up to W = ``groups`` x ``LANES`` lane sums: the grid's last block adds them all (``_finish_sum``).
    2. More: the tree's level W wide holds at index j the tree of partial[j + m W] (``_strided_tree``), and the
       grid is a multiple of ``groups`` blocks, so the blocks b = g mod ``groups`` stage exactly the summation
       blocks whose lane sums those are for the ``LANES`` indices j of group g. The last of them to count in
       counter[1 + g] computes them: ``SUBTREES`` threads an index each walk every ``SUBTREES``-th value (the
       tree's level ``SUBTREES`` x W wide), then add theirs by the tree's next levels in shared memory, and write
       it into partial[j] (which no other group reads).
    3. The last of the ``groups`` groups to count in counter[0] adds partial[:W] (``_finish_sum``).
    """
    n = partial.size
    width = groups * LANES
    if n <= width:
        _finish_sum(partial, n, counter, cuda.gridDim.x, total, d, root_d, mode, scale_out)
        return
    g = cuda.blockIdx.x % groups
    if not _last_block(counter, 1 + g, cuda.gridDim.x // groups):
        return
    padded = width
    while padded < n:
        padded *= 2
    share = min(SUBTREES, cuda.blockDim.x // LANES, padded // width)
    sub = cuda.shared.array(SUBTREE_VALUES, np.float64)
    lane = cuda.threadIdx.x % LANES
    r = cuda.threadIdx.x // LANES
    j = g * LANES + lane
    if r < share:
        sub[r * LANES + lane] = _strided_tree(partial, j + r * width, share * width)
    cuda.syncthreads()
    half = share // 2
    while half > 0:
        if r < half:
            sub[r * LANES + lane] += sub[(r + half) * LANES + lane]
        cuda.syncthreads()
        half //= 2
    if r == 0:
        partial[j] = sub[lane]
    _finish_sum(partial, width, counter, groups, total, d, root_d, mode, scale_out)


@lru_cache(maxsize=None)
def _counter(device: int, stream, size: int) -> object:
    """The ``size`` zeroed block counts of ``_last_block`` for kernels in ``stream`` on GPU ``device`` (each last
    block zeroes its count again; kernels of one stream run one after another): the grid's, then one a group
    (``_finish_lanes``)."""
    return device_zeros(device, size, np.int32)


@lru_cache(maxsize=None)
def _stand_in(device: int, dtype) -> object:
    """A one-element array on GPU ``device`` for a slot a kernel variant does not write (kernels take no None)."""
    return device_zeros(device, 1, dtype)


def _sum_slots(stream, empty, into, scale) -> tuple:
    """The arguments that finish a sum on the device: (counter, total, d, sqrt(d), mode, scale out).

    ``total`` is ``into`` or a float64 temporary (``empty``); ``scale`` is (d, power, out) for the
    float32 scale of d elements written into ``out`` beside it (mode 1 for power 2, 2 for power 1), or None.
    """
    device = device_of(stream)
    counter = _counter(device, stream, 1 + _groups())
    total = into if into is not None else empty(1, np.float64, stream)
    if scale is None:
        return counter, total, 0, 0.0, 0, _stand_in(device, np.float32)
    d, power, out = scale
    return counter, total, d, math.sqrt(d), 1 if power == 2 else 2, out


def _groups() -> int:
    """Groups of a lane-sum kernel's grid (``_finish_lanes``): ``TAIL`` lane sums, ``LANES`` a group."""
    return TAIL // LANES


def _lane_grid(lanes: int) -> int:
    """Blocks of a lane-sum kernel over ``lanes`` lane sums: one a summation block up to ``MAX_BLOCKS``; past
    ``TAIL`` lane sums a multiple of ``_groups()`` (``_finish_lanes``)."""
    blocks = _grid(lanes, LANES)
    groups = _groups()
    return blocks if lanes <= TAIL else max(groups, blocks // groups * groups)


def _summed(slots, into, scale, stream) -> float | None:
    """The finished sum: read to the host (a wait) unless it went ``into`` a device slot or made a ``scale`` (which
    is what the caller wants: the sum stays on the device)."""
    return None if into is not None or scale is not None else read_first(slots[1], stream)


def tree_sum(partial, stream=0, empty=_device_empty, into=None, scale=None) -> float | None:
    """Pairwise tree sum of a device float64 vector, as ``reference.tree_sum``; returns the float64.

    One launch of ``_collapse``: the levels down to ``COLLAPSED`` wide (or to half the padded
    length) in registers, then the grid's last block adds the rest. The value is read back
    to the host, or, when ``into`` (a one-element float64 device array) is given, left there
    (no host wait; returns None). ``scale`` = (d, power, out) also writes the float32 scale
    of d elements into ``out`` (``scale_of``'s bits) in the same launch; the sum then stays on the
    device too (``into``, or a temporary), and None is returned.
    """
    slots = _sum_slots(stream, empty, into, scale)
    padded = 1 << max(0, math.ceil(math.log2(max(1, partial.size))))
    width = min(COLLAPSED, max(1, padded // 2))
    values = empty(width, np.float64, stream)
    launch(_collapse, max(1, -(-width // COLLAPSE_THREADS)), COLLAPSE_THREADS, stream, partial, width, values,
           *slots)
    return _summed(slots, into, scale, stream)


@cuda.jit(device=True)
def _add_lanes(staged, count, partial, b, p):
    """Threads l < ``LANES``: partial[b * LANES + l] <- sum over k, in order, of |float64(staged[k * LANES + l])|^p,
    the lanes of summation block b from its ``count`` staged elements."""
    lane = cuda.threadIdx.x
    if lane < LANES:
        acc = 0.0
        for e in range(lane, count, LANES):
            acc += _power(np.float64(staged[e]), p)
        partial[b * LANES + lane] = acc


@lru_cache(maxsize=None)
def _power_lanes(with_lut: bool, p: int):
    """partial[b*LANES + l] = sum over k of |float64(err[i] + src[i])|^p, i = b*BLOCK + k*LANES + l.

    A thread block takes summation block b: its threads stage x = err + src (float32) of the
    block's elements in shared memory, neighbouring threads on neighbouring elements, then
    ``LANES`` of them add their lanes' in k order (``_add_lanes``): the order and the bits are
    those of one element at a time.
    """
    look_up = _LOOKUPS[with_lut]

    @cuda.jit
    def kernel(src, lut, err, n_src, partial, groups, counter, total, d, root_d, mode, scale_out):
        staged = cuda.shared.array(BLOCK, np.float32)
        n = err.size
        for b in range(cuda.blockIdx.x, partial.size // LANES, cuda.gridDim.x):
            first = b * BLOCK
            count = min(BLOCK, n - first)
            for e in range(cuda.threadIdx.x, count, cuda.blockDim.x):
                i = first + e
                staged[e] = err[i] + look_up(lut, src[i]) if i < n_src else err[i]
            cuda.syncthreads()
            _add_lanes(staged, count, partial, b, p)
            cuda.syncthreads()
        if groups:
            _finish_lanes(partial, groups, counter, total, d, root_d, mode, scale_out)

    return kernel


def compensated_power_sum(src, lut, err, n_src, power, stream=0, empty=_device_empty, into=None, scale=None
                          ) -> float | None:
    """Sum of |x|^power (2 or 1) of x = err + src (src zero beyond n_src), in the CPU kernel's order; writes nothing
    else, except ``into`` and ``scale`` (``tree_sum``).

    1. A thread block stages a summation block's elements; lane l of it is summed by its thread l
       in float64 (``_power_lanes``).
    2. The last blocks to finish add the lane sums by the pairwise tree in the same launch
       (``_finish_lanes``).
    """
    nblocks = max(1, -(-err.size // BLOCK))
    partial = empty(nblocks * LANES, np.float64, stream)
    slots = _sum_slots(stream, empty, into, scale)
    launch(_power_lanes(lut is not None, int(power)), _lane_grid(partial.size), LANE_THREADS, stream,
           src, _table(lut, stream), err, n_src, partial, _groups(), *slots)
    return _summed(slots, into, scale, stream)


@cuda.jit
def _segment_lanes(x, bounds, firsts, partial):
    """partial[q*LANES + l] = lane l's float64 sum of squares of summation block q of its segment, in
    ``_power_lanes``' order: segment j is x[bounds[j]:bounds[j + 1]], its blocks q in [firsts[j], firsts[j + 1]),
    found by bisection; a thread block stages block q's elements, then ``_add_lanes``."""
    staged = cuda.shared.array(BLOCK, np.float32)
    for q in range(cuda.blockIdx.x, partial.size // LANES, cuda.gridDim.x):
        j, past = 0, bounds.size - 1
        while past - j > 1:
            middle = (j + past) // 2
            if firsts[middle] <= q:
                j = middle
            else:
                past = middle
        first = bounds[j] + (q - firsts[j]) * BLOCK
        count = max(0, min(BLOCK, bounds[j + 1] - first))
        for e in range(cuda.threadIdx.x, count, cuda.blockDim.x):
            staged[e] = x[first + e]
        cuda.syncthreads()
        _add_lanes(staged, count, partial, q, 2)
        cuda.syncthreads()


@cuda.jit
def _segment_trees(partial, firsts, out):
    """out[j] <- the pairwise tree of segment j's lane sums (``_tree_in_block``), one thread block a segment."""
    for j in range(cuda.blockIdx.x, out.size, cuda.gridDim.x):
        values = partial[firsts[j] * LANES:firsts[j + 1] * LANES]
        _tree_in_block(values, values.size)
        if cuda.threadIdx.x == 0:
            out[j] = values[0]
        cuda.syncthreads()


def segment_sumsq(x, bounds, firsts, blocks, out, stream=0, empty=_device_empty) -> None:
    """out[j] <- the float64 sum of squares of x[bounds[j]:bounds[j + 1]] alone, ``compensated_power_sum``'s bits
    for it (the CPU kernel's), for every segment j, in two launches and no host wait.

    1. ``_segment_lanes``: the lane sums of every summation block of every segment
       (``firsts``: each segment's first block; ``blocks`` of them in all).
    2. ``_segment_trees``: each segment's tree of its lane sums.
    """
    partial = empty(max(1, blocks) * LANES, np.float64, stream)
    launch(_segment_lanes, _grid(blocks * LANES, LANES), LANE_THREADS, stream, x, bounds, firsts, partial)
    launch(_segment_trees, _grid(out.size, 1), COLLAPSE_THREADS, stream, partial, firsts, out)


@lru_cache(maxsize=None)
def _compensate_encode(with_lut: bool, scale_in_memory: bool):
    look_up = _LOOKUPS[with_lut]
    read_scale = _SCALE_LOADS[scale_in_memory]

    @cuda.jit
    def kernel(src, lut, err, n_src, scale_slot, bits):
        signs = cuda.shared.array(TILE, np.uint8)
        lane = cuda.threadIdx.x
        n = err.size
        scale = read_scale(scale_slot)
        for tile in range(cuda.blockIdx.x, -(-bits.size // THREADS), cuda.gridDim.x):
            base = tile * TILE
            for j in range(8):
                e = j * THREADS + lane
                i = base + e
                if i < n:
                    x = err[i] + look_up(lut, src[i]) if i < n_src else err[i]
                    if x >= 0:
                        signs[e] = 1
                        err[i] = x - scale
                    else:
                        signs[e] = 0
                        err[i] = x + scale
            cuda.syncthreads()
            k = tile * THREADS + lane
            if k < bits.size:
                bits[k] = _pack(signs, 8 * lane)
            cuda.syncthreads()

    return kernel


def compensate_encode(src, lut, err, n_src, scale, bits, stream=0) -> None:
    """x = err + src; bit = x >= 0; err = x -+ scale (float32), as the CPU kernel.

    ``scale`` is a number, or a one-element float32 device array that the kernel reads
    (a scale computed on the device: no host round trip). A block takes a tile of
    ``TILE`` elements: thread l reads and writes elements l, l + THREADS, ...
    (neighbouring threads, neighbouring elements: coalesced), keeps their signs in shared
    memory, then packs byte l of the tile from elements 8l..8l+7.
    """
    in_memory = not isinstance(scale, (int, float, np.number))
    launch(_compensate_encode(lut is not None, in_memory), _grid(bits.size), THREADS, stream,
           src, _table(lut, stream), err, n_src, scale if in_memory else np.float32(scale), bits)


@cuda.jit
def _scale_of(total, d, root_d, l2, out):
    if cuda.grid(1) == 0:
        out[0] = _scale_value(total[0], d, root_d, l2)


def scale_of(total, d, power, out, stream=0) -> None:
    """out[0] <- the float32 scale of ``d`` elements from their float64 sum of |x|^power in total[0],
    as ``spec.scale_from`` on the host: float64 sqrt and division (IEEE, correctly rounded), then
    rounded to float32. One thread; both arrays on the device, so the scale never crosses to the host."""
    launch(_scale_of, 1, 1, stream, total, d, math.sqrt(d), power == 2, out)


@cuda.jit
def _agreement_record(total, signature, d, root_d, mode, summed, record):
    if cuda.grid(1) == 0:
        t = total[0]
        finite = not (math.isinf(t) or math.isnan(t))
        value = np.float64(_scale_value(t, d, root_d, mode == 1)) if finite and mode != 0 else 0.0
        if summed:
            bits = np.int64(signature)
            for i in range(4):
                b = np.float64((bits >> (8 * i)) & 0xFF)
                record[i] = b
                record[4 + i] = b * b
            record[8] = 0.0
            record[9] = 0.0 if finite else 1.0
            record[10] = value
            record[11] = 1.0 if finite else 0.0
        else:
            record[0] = signature
            record[1] = 1.0 if finite else 0.0
            record[2] = value


def agreement_record(total, signature, d, power, summed, record, stream=0) -> None:
    """An agreement round's record of the float64 sum in total[0], written where the sum is, so that a transport
    on the device exchanges it with no host wait (``codecs.agreement_record``'s fields: the gathered round's
    (signature, finite?, value), or the ``summed`` round's bytes, squares, flags, value and finite?). value is the
    float32 scale of ``d`` elements from total[0] as ``scale_of`` gives it, or 0.0 where it is not finite or
    ``power`` is 0. One thread."""
    mode = 0 if power == 0 else 1 if power == 2 else 2
    launch(_agreement_record, 1, 1, stream, total, np.float64(signature), d, math.sqrt(d), mode, bool(summed), record)


@lru_cache(maxsize=None)
def _accumulate_lanes(with_base: bool, p: int):
    """out[i] = sum over ranks r of +-weights[r] by bit i of row r, in r order in float32 (+ base[i]); partial as
    ``_power_lanes``'s, of |out|^p.

    A thread block takes summation block b: its threads compute its elements' out (neighbouring
    threads, neighbouring elements), ``ACCUMULATED`` elements a thread per round, write them and stage them in shared
    memory; then ``LANES`` of them add their lanes' |out|^p in k order (``_add_lanes``). A round:
    1. for each rank r in order: load the round's sign bytes of row r, then add +-weights[r] to each element's
       float32 sum (its elements are ``LANE_THREADS`` apart, a multiple of 8, so each takes the same bit of its
       byte);
    2. with a base, load the round's base values, then add each to its sum;
    3. store the sums into ``out`` and ``staged``.
    """
    @cuda.jit
    def kernel(bits, weights, base, out, n_out, partial, groups, counter, total, d, root_d, mode, scale_out):
        staged = cuda.shared.array(BLOCK, np.float32)
        nranks = bits.shape[0]
        step = cuda.blockDim.x
        acc = cuda.local.array(ACCUMULATED, np.float32)
        held = cuda.local.array(ACCUMULATED, np.uint8)
        added = cuda.local.array(ACCUMULATED, np.float32)
        for b in range(cuda.blockIdx.x, partial.size // LANES, cuda.gridDim.x):
            first = b * BLOCK
            count = min(BLOCK, n_out - first)
            for k in range(cuda.threadIdx.x, count, ACCUMULATED * step):
                col = (first + k) >> 3
                shift = 7 - (k & 7)
                for u in range(ACCUMULATED):
                    acc[u] = np.float32(0)
                for r in range(nranks):
                    w = weights[r]
                    for u in range(ACCUMULATED):
                        held[u] = bits[r, col + u * (step >> 3)] if k + u * step < count else 0
                    for u in range(ACCUMULATED):
                        if (held[u] >> shift) & 1:
                            acc[u] += w
                        else:
                            acc[u] -= w
                if with_base:
                    for u in range(ACCUMULATED):
                        added[u] = base[first + k + u * step] if k + u * step < count else np.float32(0)
                    for u in range(ACCUMULATED):
                        acc[u] = acc[u] + added[u]
                for u in range(ACCUMULATED):
                    e = k + u * step
                    if e < count:
                        out[first + e] = acc[u]
                        staged[e] = acc[u]
            cuda.syncthreads()
            _add_lanes(staged, count, partial, b, p)
            cuda.syncthreads()
        if groups:
            _finish_lanes(partial, groups, counter, total, d, root_d, mode, scale_out)

    return kernel


def _launch_accumulate(bits, weights, base, out, n_out, lanes, power, stream, groups, slots) -> None:
    """The ``_accumulate_lanes`` launch; ``groups`` 0 leaves the lane sums unadded, else ``_groups()``."""
    launch(_accumulate_lanes(base is not None, int(power)), _lane_grid(lanes.size) if groups else
           _grid(lanes.size, LANES), LANE_THREADS, stream, bits, weights, out if base is None else base, out, n_out,
           lanes, groups, *slots)


def accumulate_lanes(bits, weights, base, out, n_out, lanes, power, stream=0) -> None:
    """out = sum_r weights[r] * signs(bits[r]) (+ base), rank by rank in float32; ``lanes`` <- the
    (block, lane) sums of its |out|^power, as the CPU kernel of the same name."""
    device = device_of(stream)
    slots = (_counter(device, stream, 1), _stand_in(device, np.float64), 0, 0.0, 0, _stand_in(device, np.float32))
    _launch_accumulate(bits, weights, base, out, n_out, lanes, power, stream, 0, slots)


def accumulate_signs(bits, weights, base, out, n_out, power, stream=0, empty=_device_empty, into=None, scale=None
                     ) -> float | None:
    """``accumulate_lanes``, then the sum of |out|^power: to the host, or ``into`` (and ``scale``, as ``tree_sum``),
    added by the last blocks to finish in the same launch (``_finish_lanes``)."""
    lanes = empty(max(1, -(-n_out // BLOCK)) * LANES, np.float64, stream)
    slots = _sum_slots(stream, empty, into, scale)
    _launch_accumulate(bits, weights, base, out, n_out, lanes, power, stream, _groups(), slots)
    return _summed(slots, into, scale, stream)


@cuda.jit(device=True)
def _select_row(bits, r, first, count, high, low, out, lo):
    """out[lo + k] <- high where bit k of row r of ``bits`` (its bytes from column ``first``) is set, else low, for
    k < count.

    Each thread takes ``IN_FLIGHT`` elements a grid stride apart per round (neighbouring threads, neighbouring
    elements): it loads their ``IN_FLIGHT`` sign bytes first, then stores them.
    """
    step = cuda.gridsize(1)
    signs = cuda.local.array(IN_FLIGHT, np.uint8)
    for k in range(cuda.grid(1), count, IN_FLIGHT * step):
        for u in range(IN_FLIGHT):
            j = k + u * step
            signs[u] = bits[r, first + (j >> 3)] if j < count else 0
        for u in range(IN_FLIGHT):
            j = k + u * step
            if j < count:
                out[lo + j] = high if (signs[u] >> (7 - (j & 7))) & 1 else low


@cuda.jit
def _select_decode(bits, positive, negative, out, n_out):
    rows, row_bytes = bits.shape
    row_len = row_bytes * 8
    for r in range(rows):
        lo = r * row_len
        _select_row(bits, r, 0, min(lo + row_len, n_out) - lo, positive[r], negative[r], out, lo)


def select_decode(bits, positive, negative, out, n_out, stream=0) -> None:
    """out[i] = positive[r] if element i's bit is set, else negative[r] (row r of ``bits``), cut to n_out.

    Row by row, each thread taking ``IN_FLIGHT`` elements of the row a grid stride apart (``_select_row``), so that
    neighbouring threads write neighbouring elements and no thread divides to find its row; a thread for every
    ``IN_FLIGHT`` elements of a row (at most ``MAX_BLOCKS`` blocks), so that each has all its loads in flight at once.
    """
    launch(_select_decode, _grid(min(n_out, bits.shape[1] * 8), IN_FLIGHT * THREADS), THREADS, stream, bits,
           positive, negative, out, n_out)


@cuda.jit
def _average_rows(rows, out):
    n, m = rows.shape
    divisor = np.float32(n)
    for i in range(cuda.grid(1), m, cuda.gridsize(1)):
        acc = rows[0, i]
        for r in range(1, n):
            acc += rows[r, i]
        out[i] = acc / divisor


def average_rows(rows, out, stream=0) -> None:
    """out[i] = (((rows[0, i] + rows[1, i]) + ...) + rows[n - 1, i]) / n in float32, as the CPU kernel.

    One thread per element (neighbouring threads read neighbouring elements of each row):
    1. add the rows in order in float32;
    2. divide by n (``div.rn.f32``: IEEE, as the CPU's division).
    """
    launch(_average_rows, _grid(rows.shape[1]), THREADS, stream, rows, out)


@cuda.jit(device=True)
def _write_head(rows, r, value, head):
    """The ``SCALE_BYTES`` bytes at the head of wire row r <- float32 ``value``'s, through ``head`` (a one-element
    float32 local array) and its ``.view``: ``_read_head``'s inverse."""
    head[0] = value
    raw = head.view(np.uint8)
    for j in range(SCALE_BYTES):
        rows[r, j] = raw[j]


CODE_THREADS = 256
"""Threads of a block of the scale coders: one block codes one row, or a part of one (a power of two, for its max's
tree)."""
CODE_SCALES_PER_THREAD = 8
"""Block scales a coding thread takes at most before a row is split over blocks (``code_blocks``' two launches)."""
_block_scale = cuda.jit(device=True)(scalar.block_scale)
_nearest_code = cuda.jit(device=True)(scalar.nearest_code)


@cuda.jit(device=True)
def _block_max(top, value):
    """The largest of the block's threads' ``value``s, by a tree in shared ``top``, for every thread."""
    tid = cuda.threadIdx.x
    top[tid] = value
    cuda.syncthreads()
    half = CODE_THREADS // 2
    while half > 0:
        if tid < half:
            top[tid] = max(top[tid], top[tid + half])
        cuda.syncthreads()
        half //= 2
    return top[0]


@cuda.jit(device=True)
def _scales_of(src, block, row_len, power, decoded, r, first, stride):
    """decoded[r, b] <- block b's scale for b = first, first + stride, ... of row r; returns the largest of them."""
    m = decoded.shape[1]
    largest = np.float32(0.0)
    for b in range(first, m, stride):
        s = _block_scale(src, r * m + b, block if b < m - 1 else row_len - (m - 1) * block, power)
        decoded[r, b] = s
        largest = max(largest, s)
    return largest


@cuda.jit(device=True)
def _code_row(ref, steps, values, head, rows, decoded, r, first, stride, writes_head):
    """Row r's codes against its largest scale ref for b = first, first + stride, ...: the 256 values
    float32(float64(ref) * steps[k]) in shared ``values``, ref's 4 bytes at the row's head (``writes_head``: thread 0),
    each scale's code behind it and its decoded value over it."""
    tid = cuda.threadIdx.x
    for k in range(tid, 256, CODE_THREADS):
        values[k] = np.float32(np.float64(ref) * steps[k])
    if writes_head and tid == 0:
        _write_head(rows, r, ref, head)
    cuda.syncthreads()
    for b in range(first, decoded.shape[1], stride):
        code = _nearest_code(values, decoded[r, b])
        rows[r, SCALE_BYTES + b] = code
        decoded[r, b] = values[code]
    cuda.syncthreads()


@lru_cache(maxsize=None)
def _code_blocks(power: int):
    @cuda.jit
    def kernel(src, block, row_len, steps, rows, decoded):
        tid = cuda.threadIdx.x
        top = cuda.shared.array(CODE_THREADS, np.float32)
        values = cuda.shared.array(256, np.float32)
        head = cuda.local.array(1, np.float32)
        for r in range(cuda.blockIdx.x, decoded.shape[0], cuda.gridDim.x):
            largest = _scales_of(src, block, row_len, power, decoded, r, tid, CODE_THREADS)
            ref = _block_max(top, largest)
            _code_row(ref, steps, values, head, rows, decoded, r, tid, CODE_THREADS, True)

    return kernel


@lru_cache(maxsize=None)
def _part_maxima(power: int):
    @cuda.jit
    def kernel(src, block, row_len, parts, decoded, maxima):
        tid = cuda.threadIdx.x
        top = cuda.shared.array(CODE_THREADS, np.float32)
        for q in range(cuda.blockIdx.x, decoded.shape[0] * parts, cuda.gridDim.x):
            r, g = q // parts, q % parts
            largest = _scales_of(src, block, row_len, power, decoded, r, g * CODE_THREADS + tid, parts * CODE_THREADS)
            top_value = _block_max(top, largest)
            if tid == 0:
                maxima[q] = top_value
            cuda.syncthreads()

    return kernel


@cuda.jit
def _code_parts(steps, parts, maxima, rows, decoded):
    tid = cuda.threadIdx.x
    top = cuda.shared.array(CODE_THREADS, np.float32)
    values = cuda.shared.array(256, np.float32)
    head = cuda.local.array(1, np.float32)
    for q in range(cuda.blockIdx.x, decoded.shape[0] * parts, cuda.gridDim.x):
        r, g = q // parts, q % parts
        largest = np.float32(0.0)
        for j in range(tid, parts, CODE_THREADS):
            largest = max(largest, maxima[r * parts + j])
        ref = _block_max(top, largest)
        _code_row(ref, steps, values, head, rows, decoded, r, g * CODE_THREADS + tid, parts * CODE_THREADS, g == 0)


def code_blocks(src, block, row_len, power, steps, rows, decoded, stream=0, empty=_device_empty) -> None:
    """Block scales coded against each row's largest and framed, as the CPU kernel: ``spec.block_scales_from``
    of float64 sums of |x|^power (2 "l2", 1 "l1"; 0: the float32 scales in ``src``), then ``spec.code_scales``.

    A row of up to ``CODE_THREADS * CODE_SCALES_PER_THREAD`` scales is one block's, all rows in one launch:
    1. each thread writes its blocks' scales into ``decoded`` and keeps their largest; a tree
       in shared memory makes the row's largest, ref;
    2. the 256 values float32(float64(ref) * steps[k]) in shared memory; thread 0 writes ref's
       4 bytes at the row's head;
    3. each thread codes its blocks (``scalar.nearest_code``) behind the head and writes their
       decoded values over their scales.
    A longer row is split into ``parts`` blocks (at most ``CODE_THREADS``), in two launches:
    step 1 by each part, its largest into a temporary; then each part takes the row's largest
    from its parts' (the maximum of the same scales: the same ref) and does steps 2-3 on its
    own scales, the first part writing the head.
    """
    n, m = decoded.shape
    parts = min(CODE_THREADS, -(-m // (CODE_THREADS * CODE_SCALES_PER_THREAD)))
    if parts <= 1:
        launch(_code_blocks(power), max(1, min(MAX_BLOCKS, n)), CODE_THREADS, stream,
               src, block, row_len, steps, rows, decoded)
        return
    maxima = empty(n * parts, np.float32, stream)
    grid = min(MAX_BLOCKS, n * parts)
    launch(_part_maxima(power), grid, CODE_THREADS, stream, src, block, row_len, parts, decoded, maxima)
    launch(_code_parts, grid, CODE_THREADS, stream, steps, parts, maxima, rows, decoded)


@cuda.jit(device=True)
def _read_head(rows, r, head):
    """head (a local array) <- the ``SCALE_BYTES`` bytes at the head of wire row r: read as a float32, or its bits as
    a uint32, through ``head.view`` (a bit cast the simulator runs too)."""
    for j in range(SCALE_BYTES):
        head[j] = rows[r, j]


@cuda.jit(device=True)
def _row_ref(rows, r, head):
    """float64(ref_r), ref_r the float32 at the head of wire row r (read through ``head``, a local array)."""
    _read_head(rows, r, head)
    return np.float64(head.view(np.float32)[0])


@cuda.jit(device=True)
def _code_value(ref, rows, r, b, steps):
    """Block b's scale in wire row r of head ``ref`` (``_row_ref``): float32(ref * steps[code_b]), code_b the row's
    b-th byte behind its head."""
    return np.float32(ref * steps[rows[r, SCALE_BYTES + b]])


@cuda.jit
def _decode_codes(rows, steps, divisor, decoded):
    n, m = decoded.shape
    by = np.float32(divisor)
    head = cuda.local.array(SCALE_BYTES, np.uint8)
    r, first, ref = -1, -m, 0.0
    for t in range(cuda.grid(1), n * m, cuda.gridsize(1)):
        row, first = _row_of(t, r, first, m)
        if row != r:
            r = row
            ref = _row_ref(rows, r, head)
        decoded[r, t - first] = _code_value(ref, rows, r, t - first, steps) / by


def decode_codes(rows, steps, divisor, decoded, stream=0) -> None:
    """decoded[r, b] = float32(float64(ref_r) * steps[code]) / float32(divisor) for the codes behind each wire
    row's head (its largest scale's 4 bytes), as the CPU kernel: one thread per block scale, which keeps the row of
    its last scale, and its head, and divides and reads a head only when it leaves it."""
    launch(_decode_codes, _grid(decoded.shape[0] * decoded.shape[1]), THREADS, stream, rows, steps, divisor,
           decoded)


@cuda.jit
def _head_weights(rows, divisor, out):
    by = np.float32(divisor)
    head = cuda.local.array(SCALE_BYTES, np.uint8)
    for r in range(cuda.grid(1), out.size, cuda.gridsize(1)):
        _read_head(rows, r, head)
        out[r] = head.view(np.float32)[0] / by


def head_weights(rows, divisor, out, stream=0) -> None:
    """out[r] = s_r / float32(divisor), s_r the float32 scale at the head of wire row r (IEEE float32 division, as
    ``codecs.divide_``): a frame's scales as the weights s / n in one launch, not a copy and a division by torch."""
    launch(_head_weights, _grid(out.size), THREADS, stream, rows, divisor, out)


_ROUNDINGS = {"float32": (cuda.jit(device=True)(scalar.same_bits), np.int64(1 << 31)),
              "float16": (cuda.jit(device=True)(scalar.half_bits), np.int64(1 << 15)),
              "bfloat16": (cuda.jit(device=True)(scalar.bfloat16_bits), np.int64(1 << 15))}
"""Per output dtype of ``decode_framed``: a float32's bits to the output's (rounded to nearest even), and its sign
bit."""


DECODE_TILE = TILE + TILE // 32
"""Words of a tiled decoder's shared array (``_stage_byte``): a tile's ``TILE`` elements, one word of padding after
every 32."""


@cuda.jit(device=True)
def _stage_byte(staged, byte, high, low):
    """The thread's 8 elements of the tile from its sign byte: high where the bit is set, else low, into ``staged``
    at 8 x its index (the first element in the most significant bit). With a word of padding after every 32, the 32
    threads of a warp write 32 different banks."""
    for u in range(8):
        e = 8 * cuda.threadIdx.x + u
        staged[e + (e >> 5)] = high if (byte >> (7 - u)) & 1 else low


@cuda.jit(device=True)
def _store_tile(staged, out, base, n_out):
    """out[base + e] <- the tile's staged element e, for e < ``TILE`` and base + e < n_out: neighbouring threads on
    neighbouring elements (coalesced), between the barriers that order them after the staging and before the next."""
    cuda.syncthreads()
    for j in range(8):
        e = j * THREADS + cuda.threadIdx.x
        if base + e < n_out:
            out[base + e] = staged[e + (e >> 5)]
    cuda.syncthreads()


@lru_cache(maxsize=None)
def _decode_framed(dtype: str, blocks: bool):
    """The tiled decoder of wire rows into a ``dtype`` output's raw bits: one scale a row (its head), or with
    ``blocks`` a scale a block (the head times the block's code's step; ``per_row`` codes behind the head, a block
    2^``shift`` elements)."""
    rounded, sign = _ROUNDINGS[dtype]

    @cuda.jit
    def kernel(rows, steps, per_row, shift, out, n_out):
        staged = cuda.shared.array(DECODE_TILE, np.uint32)
        head = cuda.local.array(SCALE_BYTES, np.uint8)
        value = cuda.local.array(1, np.float32)
        row_bytes = rows.shape[1] - SCALE_BYTES - per_row
        signs = SCALE_BYTES + per_row
        total = min(rows.shape[0] * row_bytes, (n_out + 7) // 8)
        r, first, ref = -1, -row_bytes, 0.0
        for tile in range(cuda.blockIdx.x, (total + THREADS - 1) // THREADS, cuda.gridDim.x):
            t = tile * THREADS + cuda.threadIdx.x
            if t < total:
                row, first = _row_of(t, r, first, row_bytes)
                if row != r:
                    r = row
                    ref = _row_ref(rows, r, head)
                c = t - first
                value[0] = _code_value(ref, rows, r, (8 * c) >> shift, steps) if blocks else np.float32(ref)
                high = rounded(np.int64(value.view(np.uint32)[0]))
                _stage_byte(staged, rows[r, signs + c], high, high ^ sign)
            _store_tile(staged, out, tile * TILE, n_out)

    return kernel


def decode_framed(rows, out, n_out, dtype: str, stream=0) -> None:
    """out[i] = +s_r if element i's bit is set, else -s_r, cut to n_out, where s_r is the float32 scale at the
    head of wire row r (``SCALE_BYTES`` little-endian bytes, then the packed signs), rounded to ``dtype``:
    ``select_decode`` reading its scales from the frames, so nothing reads, rounds, negates or copies them first.

    ``out`` is the raw view of a ``dtype`` output (float32: uint32, 16-bit: uint16).
    Tiled over the rows' sign bytes, ``TILE`` elements (``THREADS`` bytes) a tile:
    1. Each thread takes one byte: the row's head bytes make the scale's float32 bits (read when the thread's row
       changes); ``dtype``'s rounding (float16, bfloat16: to nearest even, as torch's) makes +s_r, and its sign bit
       flipped -s_r (what rounding the negated float32 gives); the byte's 8 elements go to shared memory
       (``_stage_byte``).
    2. The tile's elements are stored coalesced (``_store_tile``).
    One byte load serves 8 elements, and the stores wait only for the tile's loads.
    """
    launch(_decode_framed(dtype, False), _grid(min(rows.shape[0] * (rows.shape[1] - SCALE_BYTES), -(-n_out // 8))),
           THREADS, stream, rows, _stand_in(device_of(stream), np.float64), 0, 0, out, n_out)


@lru_cache(maxsize=None)
def _absmax_lanes(with_lut: bool):
    look_up = _LOOKUPS[with_lut]

    @cuda.jit
    def kernel(src, lut, n_src, row_len, per_row, partial):
        held = cuda.local.array(IN_FLIGHT, np.float32)
        for t in range(cuda.grid(1), partial.size, cuda.gridsize(1)):
            lane = t % LANES
            piece = t // LANES
            row = piece // per_row
            lo = row * row_len + (piece % per_row) * BLOCK
            hi = lo + BLOCK
            if (row + 1) * row_len < hi:
                hi = (row + 1) * row_len
            if n_src < hi:
                hi = n_src
            m = np.float32(0)
            for first in range(lo + lane, hi, IN_FLIGHT * LANES):
                for u in range(IN_FLIGHT):
                    i = first + u * LANES
                    held[u] = look_up(lut, src[i]) if i < hi else np.float32(0)
                for u in range(IN_FLIGHT):
                    a = held[u]
                    if a < 0:
                        a = -a
                    if a > m or a != a:
                        m = a
            partial[t] = m

    return kernel


@cuda.jit
def _absmax_rows(partial, per_row, out):
    """Block r: out[r] = the maximum of row r's partial maxima (threads stride, then a shared-memory tree)."""
    best = cuda.shared.array(THREADS, np.float32)
    r = cuda.blockIdx.x
    lane = cuda.threadIdx.x
    m = np.float32(0)
    for t in range(r * per_row * LANES + lane, (r + 1) * per_row * LANES, THREADS):
        a = partial[t]
        if a > m or a != a:
            m = a
    best[lane] = m
    cuda.syncthreads()
    width = THREADS // 2
    while width > 0:
        if lane < width:
            a = best[lane + width]
            if a > best[lane] or a != a:
                best[lane] = a
        cuda.syncthreads()
        width //= 2
    if lane == 0:
        out[r] = best[0]


def row_absmax(src, lut, n_src, row_len, out, stream=0, empty=_device_empty) -> None:
    """out[r] = max |x| over row r of x (src zero-padded beyond n_src); NaN if the row holds one.

    The maximum does not depend on the order, so lanes take partial maxima in parallel,
    then one block per row reduces them.
    """
    per_row = max(1, -(-row_len // BLOCK))
    partial = empty(out.size * per_row * LANES, np.float32, stream)
    launch(_absmax_lanes(lut is not None), _grid(partial.size), THREADS, stream,
           src, _table(lut, stream), n_src, row_len, per_row, partial)
    launch(_absmax_rows, out.size, THREADS, stream, partial, per_row, out)


@lru_cache(maxsize=None)
def _randomized_encode(with_lut: bool):
    look_up = _LOOKUPS[with_lut]

    @cuda.jit
    def kernel(src, lut, n_src, scales, key, start, rows):
        signs = cuda.shared.array(TILE, np.uint8)
        head = cuda.local.array(1, np.float32)
        lane = cuda.threadIdx.x
        n, width = rows.shape
        row_bytes = width - SCALE_BYTES
        stream_key = key[0]
        for r in range(cuda.grid(1), n, cuda.gridsize(1)):
            _write_head(rows, r, scales[r], head)
        total = n * row_bytes
        row_len = row_bytes * 8
        r, first = 0, 0
        byte_row, first_byte = 0, 0
        for tile in range(cuda.blockIdx.x, -(-total // THREADS), cuda.gridDim.x):
            base = tile * TILE
            for j in range(8):
                e = j * THREADS + lane
                i = base + e
                if i < total * 8:
                    r, first = _row_of(i, r, first, row_len)
                    x = np.float64(look_up(lut, src[i])) if i < n_src else 0.0
                    signs[e] = 1 if x > _threshold(stream_key, start + i) * np.float64(scales[r]) else 0
            cuda.syncthreads()
            t = tile * THREADS + lane
            if t < total:
                byte_row, first_byte = _row_of(t, byte_row, first_byte, row_bytes)
                rows[byte_row, SCALE_BYTES + t - first_byte] = _pack(signs, 8 * lane)
            cuda.syncthreads()

    return kernel


def randomized_encode(src, lut, n_src, scales, key, start, rows, stream=0) -> None:
    """Wire row r <- scales[r] at its head, then Birder's binary randomization of row r of x: bit i set when
    x_i > t_i * scale_r, as the CPU kernel (the head written by the kernel: no copy by torch).

    ``key`` is a one-element uint64 device array holding the stream's key, which the kernel reads from there (the
    CPU kernel takes it as a value): a launch replayed with the next call's key in that memory draws that call's
    thresholds (``codecs.stream_keys``).

    Tiled as ``compensate_encode``: coalesced element reads, signs staged in shared memory; a thread keeps the row of
    its last element (and of its last byte) and divides only when it leaves it.
    """
    launch(_randomized_encode(lut is not None), _grid(rows.shape[0] * (rows.shape[1] - SCALE_BYTES)), THREADS,
           stream, src, _table(lut, stream), n_src, scales, key, start, rows)


STAGE = 8
"""Elements of each of a thread block's summation blocks staged per round by the block kernels (their next
``STAGE`` elements, read coalesced into shared memory), which each thread then takes in order."""
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


def _staged_fold(look_up, fold, zero):
    """A kernel out[b] = ``fold`` over block b's elements x = err + src (float32) in order, from ``zero``.

    1. A thread block takes ``FOLD_THREADS`` summation blocks, a thread each (their spans in
       shared memory).
    2. Round by round their next ``STAGE`` elements are read into shared memory, a warp's load
       reading 4 blocks' 8 consecutive elements each (a thread reading its own block's made it
       touch 32 sectors for 32 elements).
    3. Each thread folds its block's staged elements in order: the order and the bits are one
       element at a time's.
    """

    @cuda.jit
    def kernel(src, lut, err, n_src, shift, row_len, out):
        staged = cuda.shared.array(_STAGED, np.float32)
        firsts = cuda.shared.array(THREADS, np.int64)
        lengths = cuda.shared.array(THREADS, np.int64)
        lane = cuda.threadIdx.x
        width = cuda.blockDim.x
        per_row = (row_len + (1 << shift) - 1) >> shift
        total = out.size
        for group in range(cuda.blockIdx.x, -(-total // width), cuda.gridDim.x):
            b = group * width + lane
            first, length = _block_span(b, total, shift, per_row, row_len)
            firsts[lane] = first
            lengths[lane] = length
            cuda.syncthreads()
            acc = zero
            for start in range(0, 1 << shift, STAGE):
                for m in range(STAGE):
                    q = m * width + lane
                    t = q // STAGE
                    j = q - t * STAGE
                    if start + j < lengths[t]:
                        i = firsts[t] + start + j
                        staged[t, j] = err[i] + look_up(lut, src[i]) if i < n_src else err[i]
                cuda.syncthreads()
                for j in range(STAGE):
                    if start + j < length:
                        acc = fold(acc, staged[lane, j])
                cuda.syncthreads()
            if b < total:
                out[b] = acc

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
        return acc + _power(np.float64(x), p)

    return _staged_fold(_LOOKUPS[with_lut], add_power, 0.0)


def block_power_sums(src, lut, err, n_src, block, row_len, power, sums, stream=0) -> None:
    """sums[r * m + b] = sum of |x|^power over block b of row r of x = err + src, sequentially in float64, as the
    CPU kernel: a thread per block, its elements staged in shared memory (``_staged_fold``)."""
    launch(_block_power_sums(lut is not None, int(power)), _grid(sums.size, FOLD_THREADS), FOLD_THREADS, stream,
           src, _table(lut, stream), err, n_src, _shift(block), row_len, sums)


def _tiled_block_encoder(look_up, code_of, one_plane: bool):
    """A kernel coding x = err + src element by element with its block's value (a scale, or a level step) and
    packing the codes' ``nbits`` bit planes into (rows, nbits * row_bytes) ``planes``, tiled as
    ``compensate_encode``.

    1. A block takes a tile of ``TILE`` elements: thread l codes elements l, l + THREADS, ...
       (coalesced reads and writes; ``code_of``: the code and the new error), keeping the codes
       in shared memory.
    2. Thread l packs byte l of the tile from elements 8l..8l+7 into each plane, the ``nbits``
       plane bytes in one 64-bit register (byte j: plane j), not a local array, which a plane
       index known only at run time would put in local memory.
    A thread keeps the row of its last element (and of its last byte) and divides only when it
    leaves it; an element's block is a shift. ``one_plane``: ``nbits`` is 1, known when compiled.
    """

    @cuda.jit
    def kernel(src, lut, err, n_src, values, shift, nbits, planes):
        codes = cuda.shared.array(TILE, np.uint8)
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
            for m in range(8):
                e = m * THREADS + lane
                i = base + e
                if i < total * 8:
                    r, first = _row_of(i, r, first, row_len)
                    x = np.float32(err[i] + look_up(lut, src[i]) if i < n_src else err[i])
                    code, left = code_of(x, values[r * per_row + ((i - first) >> shift)], nbits)
                    err[i] = left
                    codes[e] = code
            cuda.syncthreads()
            t = tile * THREADS + lane
            if t < total:
                byte_row, first_byte = _row_of(t, byte_row, first_byte, row_bytes)
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
    """1 bit: (1, x - scale) where x >= 0, else (0, x + scale), in float32, as ``compensate_encode``."""
    if x >= 0:
        return np.uint8(1), x - scale
    return np.uint8(0), x + scale


@cuda.jit(device=True)
def _level_code(x, step, nbits):
    """``nbits`` levels, as the CPU kernel: c = floor(float32(x / step) + 2^(nbits - 1)) clamped to [0, 2^nbits - 1]
    (0 where step is 0), and x - float32((c - (2^nbits - 1) / 2) * step) in float64."""
    top = np.float64((1 << nbits) - 1)
    q = np.float32(x / step) if step > 0 else np.float32(0)
    c = min(max(math.floor(np.float32(q + np.float32(1 << (nbits - 1)))), 0.0), top)
    return np.uint8(c), x - np.float32(np.float64(c - top / 2.0) * np.float64(step))


@lru_cache(maxsize=None)
def _encode_blocks(with_lut: bool):
    return _tiled_block_encoder(_LOOKUPS[with_lut], _sign_code, True)


def encode_blocks(src, lut, err, n_src, scales, block, bits, stream=0) -> None:
    """``compensate_encode`` with the scale of element k of row r at scales[r * m + k // block], into (rows,
    row_bytes) ``bits`` (possibly strided), as the CPU kernel: ``_tiled_block_encoder`` with one bit plane."""
    launch(_encode_blocks(lut is not None), _grid(bits.shape[0] * bits.shape[1]), THREADS, stream,
           src, _table(lut, stream), err, n_src, scales, _shift(block), 1, bits)


@lru_cache(maxsize=None)
def _accumulate_blocks(with_base: bool):
    @cuda.jit
    def kernel(bits, weights, shift, base, out, n_out):
        nranks = bits.shape[0]
        for i in range(cuda.grid(1), n_out, cuda.gridsize(1)):
            acc = np.float32(0)
            k = i >> shift
            for r in range(nranks):
                if (bits[r, i >> 3] >> (7 - (i & 7))) & 1:
                    acc += weights[r, k]
                else:
                    acc -= weights[r, k]
            if with_base:
                acc = acc + base[i]
            out[i] = acc

    return kernel


def accumulate_blocks(bits, weights, block, base, out, n_out, stream=0) -> None:
    """out = sum_r weights[r, i // block] * signs(bits[r]) (+ base), rank by rank in float32, as the CPU kernel:
    one thread per element (i // block a shift)."""
    launch(_accumulate_blocks(base is not None), _grid(n_out), THREADS, stream,
           bits, weights, _shift(block), out if base is None else base, out, n_out)


@cuda.jit
def _accumulate_groups(bits, weights, out, n_out):
    members = weights.shape[1]
    seg = bits.shape[1] * 8
    j, first = -1, -seg
    for i in range(cuda.grid(1), n_out, cuda.gridsize(1)):
        j, first = _row_of(i, j, first, seg)
        t = i - first
        acc = np.float32(0)
        for r in range(members):
            w = weights[j, r]
            acc += w if (bits[j * members + r, t >> 3] >> (7 - (t & 7))) & 1 else -w
        out[i] = acc


def accumulate_groups(bits, weights, out, n_out, stream=0) -> None:
    """Group j's rows into segment j of out, as the CPU kernel: one thread per element (its group kept, ``_row_of``),
    rank by rank in float32."""
    launch(_accumulate_groups, _grid(n_out), THREADS, stream, bits, weights, out, n_out)


def decode_framed_blocks(rows, steps, per_row, block, out, n_out, dtype: str, stream=0) -> None:
    """out[i] = +-s for element k of row r, cut to n_out, where s = float32(float64(ref_r) * steps[code]) from its
    block's code behind the row's head (its largest scale's 4 bytes), rounded to ``dtype`` (as ``decode_framed``),
    and its sign behind the codes: the block scales' decode and the elements' in one launch, tiled as
    ``decode_framed``: a thread takes a sign byte, whose 8 elements share a block (a block size is a power of two
    from 8), so one code and its step make their value (a thread keeps the row of its last byte, and its head, and
    divides and reads a head only when it leaves it; k // block a shift).
    ``out`` is the raw view of a ``dtype`` output (float32: uint32, 16-bit: uint16)."""
    launch(_decode_framed(dtype, True), _grid(min(rows.shape[0] * (rows.shape[1] - SCALE_BYTES - per_row),
                                                   -(-n_out // 8))), THREADS, stream, rows, steps, per_row,
           _shift(block), out, n_out)


@lru_cache(maxsize=None)
def _block_absmax(with_lut: bool):
    """out[b] = max |x| over block b's elements (``_staged_fold``)."""
    return _staged_fold(_LOOKUPS[with_lut], _larger_magnitude, np.float32(0))


def block_absmax(src, lut, err, n_src, block, row_len, out, stream=0) -> None:
    """out[r * m + b] = max |x| over block b of row r of x = err + src (NaN where it holds NaN), as the CPU kernel:
    a thread per block, its elements staged in shared memory (``_staged_fold``)."""
    launch(_block_absmax(lut is not None), _grid(out.size, FOLD_THREADS), FOLD_THREADS, stream,
           src, _table(lut, stream), err, n_src, _shift(block), row_len, out)


@lru_cache(maxsize=None)
def _encode_levels(with_lut: bool):
    return _tiled_block_encoder(_LOOKUPS[with_lut], _level_code, False)


def encode_levels(src, lut, err, n_src, steps, block, nbits, planes, stream=0) -> None:
    """The CPU kernel's levels, errors and bit planes: ``_tiled_block_encoder`` with ``nbits`` planes."""
    launch(_encode_levels(lut is not None), _grid(planes.shape[0] * (planes.shape[1] // nbits)), THREADS, stream,
           src, _table(lut, stream), err, n_src, steps, _shift(block), nbits, planes)


@cuda.jit(device=True)
def _level_of(planes, r, row_bytes, k, nbits):
    """The level of element k of row r of bit planes (``encode_levels``' layout): bit j from plane j."""
    code = 0
    for j in range(nbits):
        code |= ((planes[r, j * row_bytes + (k >> 3)] >> (7 - (k & 7))) & 1) << j
    return code


@cuda.jit
def _accumulate_levels(planes, weights, shift, nbits, out, n_out):
    nranks = planes.shape[0]
    row_bytes = planes.shape[1] // nbits
    half = ((1 << nbits) - 1) / 2.0
    for i in range(cuda.grid(1), n_out, cuda.gridsize(1)):
        acc = np.float32(0)
        k = i >> shift
        for r in range(nranks):
            acc = acc + np.float32((_level_of(planes, r, row_bytes, i, nbits) - half) * np.float64(weights[r, k]))
        out[i] = acc


def accumulate_levels(planes, weights, block, nbits, out, n_out, stream=0) -> None:
    """out = sum_r float32(level_r * weights[r, i // block]) rank by rank in float32, as the CPU kernel: one thread
    per element (i // block a shift)."""
    launch(_accumulate_levels, _grid(n_out), THREADS, stream, planes, weights, _shift(block), nbits, out, n_out)


@cuda.jit
def _decode_levels(planes, steps, shift, nbits, out, n_out):
    row_bytes = planes.shape[1] // nbits
    row_len = row_bytes * 8
    half = ((1 << nbits) - 1) / 2.0
    r, first = -1, -row_len
    for i in range(cuda.grid(1), n_out, cuda.gridsize(1)):
        r, first = _row_of(i, r, first, row_len)
        k = i - first
        out[i] = np.float32(0) + np.float32((_level_of(planes, r, row_bytes, k, nbits) - half)
                                            * np.float64(steps[r, k >> shift]))


def decode_levels(planes, steps, block, nbits, out, n_out, stream=0) -> None:
    """Row r's levels into out[r * row_len:], as the CPU kernel: one thread per element (its row kept, ``_row_of``;
    k // block a shift)."""
    launch(_decode_levels, _grid(n_out), THREADS, stream, planes, steps, _shift(block), nbits, out, n_out)
