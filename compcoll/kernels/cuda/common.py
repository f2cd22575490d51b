"""What the CUDA kernel modules share: launch geometry, element lookups, row walking and sign packing."""

from __future__ import annotations

from functools import lru_cache

import numpy as np
from numba import cuda

from .. import scalar
from ..launch import device_of, device_zeros

THREADS = 128
"""Threads of a block of the element-wise kernels and the encoders."""
MAX_BLOCKS = 4096
"""The most blocks a grid-stride kernel's grid takes (``grid_for``)."""
IN_FLIGHT = 8
"""Elements a thread loads per round before it uses them: a decoding thread (``signs._select_row``) before any of them
is stored (the compiler cannot move a load above a store to another array, as numba's arrays may alias, so one
element at a time leaves a single load in flight per thread, each behind the previous element's store); a row
maximum's lane (``randomized._absmax_lanes``) before it compares them in order (the compiler unrolled that loop 4
deep)."""
TILE = 8 * THREADS
"""Elements of an encode kernel's tile: a block packs THREADS bytes at a time."""


def table_arg(lut, stream):
    """The lookup table, or a one-element stand-in on the stream's GPU when there is none (kernels take no None
    arguments)."""
    return stand_in(device_of(stream), np.float32) if lut is None else lut


def grid_for(work: int, per_block: int = THREADS) -> int:
    """Blocks for ``work`` items of a grid-stride loop, ``per_block`` items a block (at most ``MAX_BLOCKS``)."""
    return max(1, min(MAX_BLOCKS, -(-work // per_block)))


@cuda.jit(device=True)
def row_of(i, row, first, row_len):
    """(row, its first index) of index i of rows of ``row_len``, from the thread's last (row, first): a division only
    where i left that row (a thread's indices only grow)."""
    if i - first >= row_len:
        row = i // row_len
        first = row * row_len
    return row, first


def shift_of(block: int) -> int:
    """log2 of a block size, a power of two (``spec.check_block_size``): the kernels shift an element's index by it
    where they would divide by the block size (a 64-bit division takes dozens of instructions a GPU thread)."""
    shift = int(block).bit_length() - 1
    if block != 1 << shift:
        raise ValueError(f"compcoll: block size {block} is not a power of two")
    return shift


def device_empty(size: int, dtype, stream=0):
    """Default allocator of the kernels' temporaries: numba's own (callers may pass a pooled one)."""
    return cuda.device_array(size, dtype, stream=stream)


LOOKUPS = {False: cuda.jit(device=True)(scalar.value_of), True: cuda.jit(device=True)(scalar.table_value)}
"""An element's float32 value, by whether the source is 16-bit (its raw bits through the 65536-entry table)."""
RAW_TYPES = {False: np.float32, True: np.uint16}
"""A source element's type as loaded, by whether it is 16-bit (looked up in the table after its load)."""
to_power = cuda.jit(device=True)(scalar.power)


@cuda.jit(device=True)
def pack(signs, first):
    """The byte of signs[first:first + 8] (0 or 1 each), the first in the most significant bit."""
    byte = 0
    for j in range(8):
        byte |= signs[first + j] << (7 - j)
    return byte


@cuda.jit(device=True)
def add_sign(acc, byte, w, i, nbits):
    """acc + w where element i's bit of its sign byte is set, else acc - w, in float32 (the server's rank-by-rank
    step; ``nbits`` unused, as ``blocks.rank_accumulator`` passes it to every code's adder)."""
    return acc + w if (byte >> (7 - (i & 7))) & 1 else acc - w


@lru_cache(maxsize=None)
def stand_in(device: int, dtype) -> object:
    """A one-element array on GPU ``device`` for a slot a kernel variant does not write (kernels take no None)."""
    return device_zeros(device, 1, dtype)


@lru_cache(maxsize=None)
def block_counts(device: int, stream, size: int) -> object:
    """``size`` zeroed counts of the blocks that finished a launch (and flags beside them) for kernels in ``stream`` on
    GPU ``device`` (the last block of a launch zeroes them again; kernels of one stream run one after another): the
    sums' are the grid's, then one a group (``sums._finish_lanes``); the block folds' the grid's, then a flag
    (``blocks._staged_fold``)."""
    return device_zeros(device, size, np.int32)


def finite_slots(stream, finite) -> tuple:
    """The last arguments of a fold that writes its finite test (``blocks._staged_fold``,
    ``randomized._absmax_lanes``): the stream's block counts and flag, and ``finite`` (or a stand-in)."""
    device = device_of(stream)
    return block_counts(device, stream, 2), stand_in(device, np.float64) if finite is None else finite
