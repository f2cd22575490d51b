"""Float64 sums in the CPU kernels' order, finished on the device by the pairwise tree of the last blocks to finish.

Lane l of summation block b accumulates elements b*BLOCK + k*LANES + l for k = 0, 1, ... in float64 (a thread
block stages the summation block's elements in shared memory first, all its threads loading neighbouring elements
at once, then ``LANES`` threads add the lanes); the block-major lane sums are combined by the same pairwise tree
in the same launch: the grid's last block to finish (an atomic count) adds them in shared memory, and writes the
sum and, where asked, its float32 scale. Past ``TAIL`` lane sums the last block of each group of blocks first adds
its group's part of the tree's wide levels, and the last group the rest (``_finish_lanes``). Only the final float64
crosses to the host, or none where the caller keeps it on the device (``into``, ``scale``). The sums are of a
codec's input (``compensated_power_sum``), of the server's accumulated signs (``accumulate_signs``), of a vector of
partial sums (``tree_sum``) and of a tensor's segments (``segment_sumsq``).
"""

from __future__ import annotations

import math
from functools import lru_cache

import numpy as np
from numba import cuda

from ...spec import BLOCK, LANES
from ..launch import device_of, launch, read_first
from .common import (IN_FLIGHT, LOOKUPS, RAW_TYPES, add_sign, block_counts, device_empty, grid_for, stand_in, table_arg,
                     to_power)
from .records import scale_value

BLOCK_WORDS = BLOCK // 2
"""float64 words of a lane-sum kernel's shared block: its summation block's ``BLOCK`` float32 elements staged (a
float32 view), then its last block's lane sums (``_finish_in_shared``); declared float64 so that it is 8-byte
aligned (numba aligns a shared array to its own dtype)."""
TAIL = BLOCK_WORDS
"""Lane sums up to which the last block of the kernel that wrote them adds them all itself, in its shared block
(``BLOCK_WORDS``: ``_finish_in_shared``); past it, the width of the tree's level that the last blocks of its
``TAIL // LANES`` groups write (``_finish_lanes``)."""
COLLAPSED = 32768
"""The width ``_collapse`` takes the tree down to before its last block adds the rest."""
COLLAPSE_THREADS = 1024
"""Threads per block of ``_collapse``: its last block adds up to ``COLLAPSED`` values alone."""
LANE_THREADS = 256
"""Threads of a lane-sum kernel's block (a multiple of ``LANES``): together they stage one summation block's
``BLOCK`` elements in shared memory (all their loads in flight at once), then ``LANES`` of them add the lanes in
order."""
RANK_GROUP = 8
"""Ranks whose sign bytes an accumulating block stages in shared memory at once (``_accumulate_lanes``): a
summation block's ``BLOCK // 8`` bytes of each, loaded by all its threads ``common.IN_FLIGHT`` at a time."""
ROW_BYTES = BLOCK // 8
"""Sign bytes of one rank's row in a summation block."""
ROW_SHIFT = ROW_BYTES.bit_length() - 1
"""log2 of ``ROW_BYTES``: a staged byte's rank is a shift of its index, its column a mask."""
STAGED_LOADS = 16
"""Elements a thread of the lane sums of an input (``_power_lanes``: source and error; ``_segment_lanes``) loads
before it stages any: a summation block's 32 a thread in 2 rounds."""
GROUP_BYTES = RANK_GROUP * ROW_BYTES
"""The staged sign bytes of a group of ranks (numba sizes a shared array by one constant)."""


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
def _write_sum(values, total, d, root_d, mode, scale_out):
    """Thread 0: total[0] <- values[0] (a tree's root), and (mode 1: l2, 2: l1) the float32 scale of ``d`` elements
    from it into scale_out[0]."""
    if cuda.threadIdx.x == 0:
        t = values[0]
        total[0] = t
        if mode != 0:
            scale_out[0] = scale_value(t, d, root_d, mode == 1)


@cuda.jit(device=True)
def _finish_sum(values, size, counter, expected, total, d, root_d, mode, scale_out):
    """The last of ``expected`` blocks to count in counter[0]: the tree of values[:size] into total[0], and the
    scale (``_write_sum``), in place in ``values``."""
    if _last_block(counter, 0, expected):
        _tree_in_block(values, size)
        _write_sum(values, total, d, root_d, mode, scale_out)


@cuda.jit(device=True)
def _finish_in_shared(values, size, scratch, counter, expected, total, d, root_d, mode, scale_out):
    """``_finish_sum`` with the tree taken in shared memory ``scratch`` (size <= scratch.size), the same bits.

    1. The last block's threads copy values[:size] into ``scratch``, ``IN_FLIGHT`` loads a thread at a time (a
       tree's level in global memory waits a round trip to L2 for each of its values a thread).
    2. The tree of scratch[:size] (``_tree_in_block``), then ``_write_sum``.
    """
    if _last_block(counter, 0, expected):
        held = cuda.local.array(IN_FLIGHT, np.float64)
        step = cuda.blockDim.x
        for first in range(cuda.threadIdx.x, size, IN_FLIGHT * step):
            _load_round(values, 0, first, size, step, held)
            _stage_round(scratch, first, size, step, held)
        cuda.syncthreads()
        _tree_in_block(scratch, size)
        _write_sum(scratch, total, d, root_d, mode, scale_out)


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
def _finish_lanes(partial, groups, scratch, counter, total, d, root_d, mode, scale_out):
    """The end of a lane-sum kernel: the pairwise tree of its lane sums partial[:n] into total[0] (and the scale, as
    ``_finish_sum``), by the last blocks to finish, in the same launch; ``scratch`` is shared memory for W float64
    (the kernel's staged block, done with).

    1. Up to W = ``groups`` x ``LANES`` lane sums: the grid's last block adds them all in ``scratch``
       (``_finish_in_shared``).
    2. More: the tree's level W wide holds at index j the tree of partial[j + m W] (``_strided_tree``), and the
       grid is a multiple of ``groups`` blocks, so the blocks b = g mod ``groups`` stage exactly the summation
       blocks whose lane sums those are for the ``LANES`` indices j of group g. The last of them to count in
       counter[1 + g] computes them: ``SUBTREES`` threads an index each walk every ``SUBTREES``-th value (the
       tree's level ``SUBTREES`` x W wide), then add theirs by the tree's next levels in shared memory, and write
       it into partial[j] (which no other group reads).
    3. The last of the ``groups`` groups to count in counter[0] adds partial[:W] in ``scratch``
       (``_finish_in_shared``).
    """
    n = partial.size
    width = groups * LANES
    if n <= width:
        _finish_in_shared(partial, n, scratch, counter, cuda.gridDim.x, total, d, root_d, mode, scale_out)
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
    _finish_in_shared(partial, width, scratch, counter, groups, total, d, root_d, mode, scale_out)


def _sum_slots(stream, empty, into, scale) -> tuple:
    """The arguments that finish a sum on the device: (counter, total, d, sqrt(d), mode, scale out).

    ``total`` is ``into`` or a float64 temporary (``empty``); ``scale`` is (d, power, out) for the
    float32 scale of d elements written into ``out`` beside it (mode 1 for power 2, 2 for power 1), or None.
    """
    device = device_of(stream)
    counter = block_counts(device, stream, 1 + _groups())
    total = into if into is not None else empty(1, np.float64, stream)
    if scale is None:
        return counter, total, 0, 0.0, 0, stand_in(device, np.float32)
    d, power, out = scale
    return counter, total, d, math.sqrt(d), 1 if power == 2 else 2, out


def _groups() -> int:
    """Groups of a lane-sum kernel's grid (``_finish_lanes``): ``TAIL`` lane sums, ``LANES`` a group."""
    return TAIL // LANES


def _launch_lanes(kernel, stream, args: tuple, partial, slots: tuple | None) -> None:
    """Launch lane-sum ``kernel`` (its ``args``, then ``partial``, its groups and the sum's slots) in ``stream``.

    1. ``slots`` None: the lane sums are left in ``partial``, one block a summation block (at most
       ``common.MAX_BLOCKS``), no groups and stand-in slots.
    2. Otherwise (``_sum_slots``): the last blocks to finish add them (``_finish_lanes``), ``_lane_grid`` blocks in
       ``_groups()`` groups.
    """
    if slots is None:
        device = device_of(stream)
        launch(kernel, grid_for(partial.size, LANES), LANE_THREADS, stream, *args, partial, 0,
               block_counts(device, stream, 1), stand_in(device, np.float64), 0, 0.0, 0, stand_in(device, np.float32))
    else:
        launch(kernel, _lane_grid(partial.size), LANE_THREADS, stream, *args, partial, _groups(), *slots)


def _lane_grid(lanes: int) -> int:
    """Blocks of a lane-sum kernel over ``lanes`` lane sums: one a summation block up to ``common.MAX_BLOCKS``; past
    ``TAIL`` lane sums a multiple of ``_groups()`` (``_finish_lanes``)."""
    blocks = grid_for(lanes, LANES)
    groups = _groups()
    return blocks if lanes <= TAIL else max(groups, blocks // groups * groups)


def _summed(slots, into, scale, stream) -> float | None:
    """The finished sum: read to the host (a wait) unless it went ``into`` a device slot or made a ``scale`` (which
    is what the caller wants: the sum stays on the device)."""
    return None if into is not None or scale is not None else read_first(slots[1], stream)


def tree_sum(partial, stream=0, empty=device_empty, into=None, scale=None) -> float | None:
    """Pairwise tree sum of a device float64 vector, as ``reference.tree_sum``; returns the float64.

    One launch of ``_collapse``: the levels down to ``COLLAPSED`` wide (or to half the padded
    length) in registers, then the grid's last block adds the rest. The value is read back
    to the host, or, when ``into`` (a one-element float64 device array) is given, left there
    (no host wait; returns None). ``scale`` = (d, power, out) also writes the float32 scale
    of d elements into ``out`` (``records.scale_of``'s bits) in the same launch; the sum then stays on the
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
def _load_round(values, first, k, count, step, held):
    """held[u] <- values[first + k + u * step] for u < held.size, 0 where k + u * step >= ``count``: a thread's
    round of loads, all in flight before any is used."""
    for u in range(held.size):
        e = k + u * step
        held[u] = values[first + e] if e < count else np.float32(0)


@cuda.jit(device=True)
def _stage_round(staged, k, count, step, held):
    """staged[k + u * step] <- held[u] for u < held.size where k + u * step < ``count``: a round's stores."""
    for u in range(held.size):
        e = k + u * step
        if e < count:
            staged[e] = held[u]


@cuda.jit(device=True)
def _add_lanes(staged, count, partial, b, p):
    """Threads l < ``LANES``: partial[b * LANES + l] <- sum over k, in order, of |float64(staged[k * LANES + l])|^p,
    the lanes of summation block b from its ``count`` staged elements.

    A lane's adds depend each on the one before, so a thread loads ``IN_FLIGHT`` of its elements first, then adds
    them in order: one wait for shared memory a round, not one an element. Past ``count`` it adds 0.0, which leaves
    the sum's bits as they are (the sum is +0.0, positive, infinite or NaN, never -0.0).
    """
    lane = cuda.threadIdx.x
    if lane < LANES:
        held = cuda.local.array(IN_FLIGHT, np.float32)
        acc = 0.0
        for first in range(lane, count, IN_FLIGHT * LANES):
            for u in range(IN_FLIGHT):
                e = first + u * LANES
                held[u] = staged[e] if e < count else np.float32(0)
            for u in range(IN_FLIGHT):
                acc += to_power(np.float64(held[u]), p)
        partial[b * LANES + lane] = acc


@lru_cache(maxsize=None)
def _power_lanes(with_lut: bool, p: int):
    """partial[b*LANES + l] = sum over k of |float64(err[i] + src[i])|^p, i = b*BLOCK + k*LANES + l.

    A thread block of ``LANE_THREADS`` takes summation block b:
    1. its threads stage x = err + src (float32) of the block's elements in shared memory, neighbouring threads on
       neighbouring elements, each loading ``STAGED_LOADS`` elements' src and err (raw, a grid stride of
       ``LANE_THREADS`` apart: a constant, so that the compiler folds each element's offset into its load) before it
       looks any up, adds or stores (numba's arrays may alias, so a load waits behind a store before it);
    2. ``LANES`` of them add their lanes' in k order (``_add_lanes``): the order and the bits are those of one
       element at a time.
    """
    look_up, raw_type = LOOKUPS[with_lut], RAW_TYPES[with_lut]

    @cuda.jit
    def kernel(src, lut, err, n_src, partial, groups, counter, total, d, root_d, mode, scale_out):
        block = cuda.shared.array(BLOCK_WORDS, np.float64)
        staged = block.view(np.float32)
        raw = cuda.local.array(STAGED_LOADS, raw_type)
        held = cuda.local.array(STAGED_LOADS, np.float32)
        step = LANE_THREADS
        n = err.size
        for b in range(cuda.blockIdx.x, partial.size // LANES, cuda.gridDim.x):
            first = b * BLOCK
            count = min(BLOCK, n - first)
            for k in range(cuda.threadIdx.x, count, STAGED_LOADS * step):
                for u in range(STAGED_LOADS):
                    e = k + u * step
                    raw[u] = src[first + e] if e < count and first + e < n_src else 0
                _load_round(err, first, k, count, step, held)
                for u in range(STAGED_LOADS):
                    if first + k + u * step < n_src:
                        held[u] = held[u] + look_up(lut, raw[u])
                _stage_round(staged, k, count, step, held)
            cuda.syncthreads()
            _add_lanes(staged, count, partial, b, p)
            cuda.syncthreads()
        if groups:
            _finish_lanes(partial, groups, block, counter, total, d, root_d, mode, scale_out)

    return kernel


def compensated_power_sum(src, lut, err, n_src, power, stream=0, empty=device_empty, into=None, scale=None
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
    _launch_lanes(_power_lanes(lut is not None, int(power)), stream, (src, table_arg(lut, stream), err, n_src),
                  partial, slots)
    return _summed(slots, into, scale, stream)


@lru_cache(maxsize=None)
def _accumulate_lanes(with_base: bool, p: int):
    """out[i] = sum over ranks r of +-weights[r] by bit i of row r, in r order in float32 (+ base[i]); partial as
    ``_power_lanes``'s, of |out|^p.

    A thread block takes summation block b, its elements' float32 sums kept in shared memory (``staged``), so that
    a thread waits for memory once for many ranks and elements, not once a rank a few elements:
    1. for each group of ``RANK_GROUP`` ranks in order: its threads stage the group's sign bytes of the block and
       its weights in shared memory, ``IN_FLIGHT`` loads a thread at a time; then each thread adds +-weights[r],
       r in order, to the sums of its elements (neighbouring threads, neighbouring elements), from 0 at the first
       group;
    2. with a base, its threads load the block's base values ``IN_FLIGHT`` at a time and add each to its sum;
       they store the sums into ``out`` and ``staged``;
    3. ``LANES`` of them add their lanes' |out|^p in k order (``_add_lanes``).
    """
    @cuda.jit
    def kernel(bits, weights, base, out, n_out, partial, groups, counter, total, d, root_d, mode, scale_out):
        block = cuda.shared.array(BLOCK_WORDS, np.float64)
        staged = block.view(np.float32)
        signs = cuda.shared.array(GROUP_BYTES, np.uint8)
        scales = cuda.shared.array(RANK_GROUP, np.float32)
        held = cuda.local.array(IN_FLIGHT, np.uint8)
        added = cuda.local.array(IN_FLIGHT, np.float32)
        nranks = bits.shape[0]
        lane = cuda.threadIdx.x
        step = cuda.blockDim.x
        for b in range(cuda.blockIdx.x, partial.size // LANES, cuda.gridDim.x):
            first = b * BLOCK
            count = min(BLOCK, n_out - first)
            col = first >> 3
            used = (count + 7) >> 3
            for g in range(0, nranks, RANK_GROUP):
                ranks = min(RANK_GROUP, nranks - g)
                size = ranks * ROW_BYTES
                if lane < ranks:
                    scales[lane] = weights[g + lane]
                for q in range(lane, size, IN_FLIGHT * step):
                    for u in range(IN_FLIGHT):
                        c = q + u * step
                        column = c & (ROW_BYTES - 1)
                        held[u] = bits[g + (c >> ROW_SHIFT), col + column] if c < size and column < used else 0
                    for u in range(IN_FLIGHT):
                        c = q + u * step
                        if c < size:
                            signs[c] = held[u]
                cuda.syncthreads()
                for e in range(lane, count, step):
                    acc = staged[e] if g > 0 else np.float32(0)
                    for j in range(ranks):
                        acc = add_sign(acc, signs[j * ROW_BYTES + (e >> 3)], scales[j], e, 1)
                    staged[e] = acc
                cuda.syncthreads()
            for k in range(lane, count, IN_FLIGHT * step):
                if with_base:
                    _load_round(base, first, k, count, step, added)
                for u in range(IN_FLIGHT):
                    e = k + u * step
                    if e < count:
                        acc = staged[e] if nranks > 0 else np.float32(0)
                        if with_base:
                            acc = acc + added[u]
                        out[first + e] = acc
                        staged[e] = acc
            cuda.syncthreads()
            _add_lanes(staged, count, partial, b, p)
            cuda.syncthreads()
        if groups:
            _finish_lanes(partial, groups, block, counter, total, d, root_d, mode, scale_out)

    return kernel


def accumulate_lanes(bits, weights, base, out, n_out, lanes, power, stream=0) -> None:
    """out = sum_r weights[r] * signs(bits[r]) (+ base), rank by rank in float32; ``lanes`` <- the
    (block, lane) sums of its |out|^power, as the CPU kernel of the same name."""
    _launch_lanes(_accumulate_lanes(base is not None, int(power)), stream,
                  (bits, weights, out if base is None else base, out, n_out), lanes, None)


def accumulate_signs(bits, weights, base, out, n_out, power, stream=0, empty=device_empty, into=None, scale=None
                     ) -> float | None:
    """``accumulate_lanes``, then the sum of |out|^power: to the host, or ``into`` (and ``scale``, as ``tree_sum``),
    added by the last blocks to finish in the same launch (``_finish_lanes``)."""
    lanes = empty(max(1, -(-n_out // BLOCK)) * LANES, np.float64, stream)
    slots = _sum_slots(stream, empty, into, scale)
    _launch_lanes(_accumulate_lanes(base is not None, int(power)), stream,
                  (bits, weights, out if base is None else base, out, n_out), lanes, slots)
    return _summed(slots, into, scale, stream)


@cuda.jit
def _segment_lanes(x, bounds, firsts, partial):
    """partial[q*LANES + l] = lane l's float64 sum of squares of summation block q of its segment, in
    ``_power_lanes``' order: segment j is x[bounds[j]:bounds[j + 1]], its blocks q in [firsts[j], firsts[j + 1]),
    found by bisection; a thread block of ``LANE_THREADS`` stages block q's elements (``STAGED_LOADS`` loads a thread
    before its stores, as ``_power_lanes``), then ``_add_lanes``."""
    staged = cuda.shared.array(BLOCK, np.float32)
    held = cuda.local.array(STAGED_LOADS, np.float32)
    step = LANE_THREADS
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
        for k in range(cuda.threadIdx.x, count, STAGED_LOADS * step):
            _load_round(x, first, k, count, step, held)
            _stage_round(staged, k, count, step, held)
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


def segment_sumsq(x, bounds, firsts, blocks, out, stream=0, empty=device_empty) -> None:
    """out[j] <- the float64 sum of squares of x[bounds[j]:bounds[j + 1]] alone, ``compensated_power_sum``'s bits
    for it (the CPU kernel's), for every segment j, in two launches and no host wait.

    1. ``_segment_lanes``: the lane sums of every summation block of every segment
       (``firsts``: each segment's first block; ``blocks`` of them in all).
    2. ``_segment_trees``: each segment's tree of its lane sums.
    """
    partial = empty(max(1, blocks) * LANES, np.float64, stream)
    launch(_segment_lanes, grid_for(blocks * LANES, LANES), LANE_THREADS, stream, x, bounds, firsts, partial)
    launch(_segment_trees, grid_for(out.size, 1), COLLAPSE_THREADS, stream, partial, firsts, out)
