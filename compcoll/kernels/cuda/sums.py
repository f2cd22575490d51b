"""Float64 sums in the CPU kernels' order, finished on the device by the pairwise tree of the last blocks to finish.

Lane l of summation block b accumulates elements b*BLOCK + k*LANES + l for k = 0, 1, ... in float64 (a warp takes a
summation block, its thread l lane l, and loads ``LANE_LOADS`` of its lane's elements before it adds them in order:
``_warp_blocks``); the block-major lane sums are combined by the same pairwise tree in the same launch: the grid's
last block to finish (an atomic count) adds them in shared memory, and writes the sum and, where asked, its float32
scale. Past ``TAIL`` lane sums the last block of each group of blocks first adds its group's part of the tree's wide
levels, and the last group the rest (``_finish_lanes``). Only the final float64 crosses to the host, or none where
the caller keeps it on the device (``into``, ``scale``). The sums are of a codec's input (``compensated_power_sum``),
of the server's accumulated signs (``accumulate_signs``), of a vector of partial sums (``tree_sum``) and of a
tensor's segments (``segment_sumsq``).
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
"""Threads of a lane-sum kernel's block (a multiple of ``LANES``): each warp takes a summation block of its own
(``_warp_blocks``)."""
LANE_LOADS = 16
"""Elements a lane of a summation block loads before it adds any (``_power_lanes``, ``_segment_lanes``: source and
error, or the input alone): a lane's 256 of a block in 16 rounds."""
ROUND = LANE_LOADS * LANES
"""Elements of a summation block's round in a warp: its lanes' ``LANE_LOADS`` each (16 rounds a block)."""
RUN = ROUND // LANES
"""Neighbouring elements of a round whose ranks a thread of ``_accumulate_lanes`` adds: two sign bytes of a rank."""
RANK_GROUP = 4
"""Ranks whose sign bytes and weights a thread of ``_accumulate_lanes`` loads at once, before it adds any."""
GROUP_LOADS = RANK_GROUP * RUN // 8
"""Sign bytes a thread of ``_accumulate_lanes`` holds for a group of ranks (numba sizes an array by one constant)."""
STAGE_WORDS = ROUND + ROUND // LANES
"""float32 words of a warp's round of sums in ``_accumulate_lanes``' shared memory: a word of padding after every
``LANES`` (a run, ``RUN`` dividing ``LANES``, never crosses one). The warps of a block of ``LANE_THREADS`` use 4224
of the 8192 of its shared block."""


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
       grid is a multiple of ``groups`` blocks, whose summation blocks are their own index modulo the grid
       (``_warp_blocks``), so the blocks b = g mod ``groups`` take exactly the summation blocks whose lane sums
       those are for the ``LANES`` indices j of group g. The last of them to count in
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
    """Launch lane-sum ``kernel`` (its ``args``, then ``partial``, its groups and the sum's slots) in ``stream``, in
    blocks of ``LANE_THREADS``, a summation block a warp (``_warp_blocks``).

    1. ``slots`` None: the lane sums are left in ``partial``, a thread for each (at most ``common.MAX_BLOCKS``
       blocks), no groups and stand-in slots.
    2. Otherwise (``_sum_slots``): the last blocks to finish add them (``_finish_lanes``), ``_lane_grid`` blocks in
       ``_groups()`` groups.
    """
    if slots is None:
        device = device_of(stream)
        launch(kernel, grid_for(partial.size, LANE_THREADS), LANE_THREADS, stream, *args, partial, 0,
               block_counts(device, stream, 1), stand_in(device, np.float64), 0, 0.0, 0, stand_in(device, np.float32))
    else:
        launch(kernel, _lane_grid(partial.size), LANE_THREADS, stream, *args, partial, _groups(), *slots)


def _lane_grid(lanes: int) -> int:
    """Blocks of a lane-sum kernel over ``lanes`` lane sums, a thread for each up to ``common.MAX_BLOCKS``; past
    ``TAIL`` lane sums a multiple of ``_groups()`` (``_finish_lanes``)."""
    blocks = grid_for(lanes, LANE_THREADS)
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
def _warp_blocks():
    """(this warp's first summation block, the step to its next): warp w of thread block B takes summation blocks
    B + w * grid, then every (warps a block x grid)-th, all of them B modulo the grid (``_finish_lanes`` counts a
    thread block in the group of its summation blocks)."""
    return cuda.threadIdx.x // LANES * cuda.gridDim.x + cuda.blockIdx.x, cuda.blockDim.x // LANES * cuda.gridDim.x


@cuda.jit(device=True)
def _add_held(acc, held, p):
    """acc + |float64(held[0])|^p + |float64(held[1])|^p + ..., in order: a lane's adds of a round (the zeros of a
    round past its block's end leave the sum's bits as they are: it is +0.0, positive, infinite or NaN, never
    -0.0)."""
    for u in range(held.size):
        acc += to_power(np.float64(held[u]), p)
    return acc


@lru_cache(maxsize=None)
def _power_lanes(with_lut: bool, p: int):
    """partial[b*LANES + l] = sum over k of |float64(err[i] + src[i])|^p, i = b*BLOCK + k*LANES + l.

    A warp takes a summation block (``_warp_blocks``; a block of ``LANE_THREADS`` threads takes several at once), its
    thread l lane l, neighbouring threads on neighbouring elements:
    1. a round loads ``LANE_LOADS`` of the lane's elements' src and err (raw, ``LANES`` apart: a constant, folded into
       the loads) before it looks any up or adds (``_load_round``);
    2. then x = err + src in float32, and their |x|^p added to the lane's float64 sum in k order (``_add_held``):
       the order and the bits of one element at a time. Every warp of the grid has its loads in flight while
       others add: no barrier, no staging.
    3. The last blocks to finish add the lane sums (``_finish_lanes``, in ``block``: shared memory for that alone).
    """
    look_up, raw_type = LOOKUPS[with_lut], RAW_TYPES[with_lut]

    @cuda.jit
    def kernel(src, lut, err, n_src, partial, groups, counter, total, d, root_d, mode, scale_out):
        block = cuda.shared.array(BLOCK_WORDS, np.float64)
        raw = cuda.local.array(LANE_LOADS, raw_type)
        held = cuda.local.array(LANE_LOADS, np.float32)
        lane = cuda.threadIdx.x % LANES
        n = err.size
        start, stride = _warp_blocks()
        for b in range(start, partial.size // LANES, stride):
            first = b * BLOCK
            count = min(BLOCK, n - first)
            known = min(count, n_src - first)
            acc = 0.0
            for k in range(lane, count, LANE_LOADS * LANES):
                for u in range(LANE_LOADS):
                    e = k + u * LANES
                    raw[u] = src[first + e] if e < known else raw_type(0)
                _load_round(err, first, k, count, LANES, held)
                for u in range(LANE_LOADS):
                    if k + u * LANES < known:
                        held[u] = held[u] + look_up(lut, raw[u])
                acc = _add_held(acc, held, p)
            partial[b * LANES + lane] = acc
        if groups:
            _finish_lanes(partial, groups, block, counter, total, d, root_d, mode, scale_out)

    return kernel


def compensated_power_sum(src, lut, err, n_src, power, stream=0, empty=device_empty, into=None, scale=None
                          ) -> float | None:
    """Sum of |x|^power (2 or 1) of x = err + src (src zero beyond n_src), in the CPU kernel's order; writes nothing
    else, except ``into`` and ``scale`` (``tree_sum``).

    1. A warp takes a summation block; its thread l sums lane l in float64 (``_power_lanes``).
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

    A warp takes a summation block, as ``_power_lanes`` (``_warp_blocks``), in rounds of ``ROUND`` elements; the
    warps of a thread block take their rounds together, as they meet at barriers (a warp whose blocks ran out, or
    whose block ends sooner, takes empty ones). A round:
    1. with a base, thread l loads the base of its lane's ``LANE_LOADS`` elements of the round (the lane's order:
       ``LANES`` apart);
    2. it adds the ranks of ``RUN`` neighbouring elements of the round, its run (two sign bytes a rank): for each
       group of ``RANK_GROUP`` ranks in order it loads their bytes and weights (all in flight at once), then adds
       +-weights[r], r in order, to the run's float32 sums, from 0;
    3. it stores the run's sums in the warp's part of shared memory (``staged``: a word of padding after every
       ``LANES``, so that neither a run's stores nor a lane's loads meet in a bank: element e of the round at
       e + e // LANES, a run's from its first, a lane's ``LANES + 1`` apart); a barrier;
    4. it loads its lane's sums of the round, adds the base to each, stores them into ``out`` (at constant
       offsets from the lane's first of the round: each store's address computed anew took 128 registers, 80-96
       now), and adds their |out|^p to the lane's float64 sum in k order (``_add_held``); a barrier before the
       next round's stores.
    The last blocks to finish add the lane sums (``_finish_lanes``, in the same shared memory).
    """
    @cuda.jit
    def kernel(bits, weights, base, out, n_out, partial, groups, counter, total, d, root_d, mode, scale_out):
        block = cuda.shared.array(BLOCK_WORDS, np.float64)
        staged = block.view(np.float32)
        signs = cuda.local.array(GROUP_LOADS, np.uint8)
        scales = cuda.local.array(RANK_GROUP, np.float32)
        sums = cuda.local.array(RUN, np.float32)
        added = cuda.local.array(LANE_LOADS, np.float32)
        nranks = bits.shape[0]
        lane = cuda.threadIdx.x % LANES
        warp = cuda.threadIdx.x // LANES
        part = warp * STAGE_WORDS
        nblocks = partial.size // LANES
        start, stride = _warp_blocks()
        for first_block in range(cuda.blockIdx.x, nblocks, stride):
            b = first_block + start - cuda.blockIdx.x
            first = b * BLOCK
            count = min(BLOCK, n_out - first) if b < nblocks else 0
            acc = 0.0
            for k in range(0, min(BLOCK, n_out - first_block * BLOCK), ROUND):
                if with_base:
                    _load_round(base, first, k + lane, count, LANES, added)
                run = k + RUN * lane
                col = (first + run) >> 3
                for j in range(RUN):
                    sums[j] = np.float32(0)
                for g in range(0, nranks, RANK_GROUP):
                    for r in range(RANK_GROUP):
                        if g + r < nranks:
                            scales[r] = weights[g + r]
                            row = bits[g + r, col:]
                            for q in range(RUN // 8):
                                signs[r * (RUN // 8) + q] = row[q] if run + 8 * q < count else 0
                    for r in range(RANK_GROUP):
                        if g + r < nranks:
                            for j in range(RUN):
                                sums[j] = add_sign(sums[j], signs[r * (RUN // 8) + (j >> 3)], scales[r], j, 1)
                mine = staged[part + RUN * lane + RUN * lane // LANES:]
                for j in range(RUN):
                    mine[j] = sums[j]
                cuda.syncthreads()
                ours = staged[part + lane:]
                into = out[first + k + lane:]
                for u in range(LANE_LOADS):
                    x = ours[u * (LANES + 1)]
                    if with_base:
                        x = x + added[u]
                    if k + lane + u * LANES < count:
                        into[u * LANES] = x
                    else:
                        x = np.float32(0)
                    added[u] = x
                acc = _add_held(acc, added, p)
                cuda.syncthreads()
            if b < nblocks:
                partial[b * LANES + lane] = acc
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
    ``_power_lanes``' order and way (a warp a summation block, ``LANE_LOADS`` loads a lane in flight before it adds):
    segment j is x[bounds[j]:bounds[j + 1]], its blocks q in [firsts[j], firsts[j + 1]), found by bisection."""
    held = cuda.local.array(LANE_LOADS, np.float32)
    lane = cuda.threadIdx.x % LANES
    start, stride = _warp_blocks()
    for q in range(start, partial.size // LANES, stride):
        j, past = 0, bounds.size - 1
        while past - j > 1:
            middle = (j + past) // 2
            if firsts[middle] <= q:
                j = middle
            else:
                past = middle
        first = bounds[j] + (q - firsts[j]) * BLOCK
        count = max(0, min(BLOCK, bounds[j + 1] - first))
        acc = 0.0
        for k in range(lane, count, LANE_LOADS * LANES):
            _load_round(x, first, k, count, LANES, held)
            acc = _add_held(acc, held, 2)
        partial[q * LANES + lane] = acc


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
    launch(_segment_lanes, grid_for(blocks * LANES, LANE_THREADS), LANE_THREADS, stream, x, bounds, firsts, partial)
    launch(_segment_trees, grid_for(out.size, 1), COLLAPSE_THREADS, stream, partial, firsts, out)
