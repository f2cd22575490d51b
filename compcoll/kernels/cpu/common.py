"""What the CPU kernels share: Numba's threading layer, serial twins, loads and steps, sign packing, segments' tasks.

The element loads and scalar steps are ``kernels.scalar``'s, inlined.

Unless ``NUMBA_THREADING_LAYER`` says otherwise, the kernels run on Numba's own "workqueue" threads: with the
OpenMP layer, torchrun jobs that also hold torch's OpenMP runtime aborted at exit now and then ("terminate called
without an active exception"; 3 of 40 runs of examples/train.py, none of 32 with workqueue), and with TBB's a
process hung at exit (``layer_warning``, which warns where the variable names another layer). Inputs below
``serial.serial_below()`` elements run a serial twin of each kernel instead.

Numba's on-disk cache keys a kernel by the file that defines it, not by the functions it inlines from here or
from ``kernels.scalar``: after a change to either alone, clear the cache (``compcoll.warmup.cache_dir``) or use a
fresh ``NUMBA_CACHE_DIR``.
"""

from __future__ import annotations

import os
import types
import warnings

import numba
import numpy as np
from numba import njit

from .. import scalar
from ...spec import BLOCK, SCALE_BYTES

LAYER = "workqueue"
"""The threading layer compcoll sets where ``NUMBA_THREADING_LAYER`` names none."""


def layer_warning(chosen: str | None) -> str | None:
    """What goes wrong under the threading layer ``chosen`` (``NUMBA_THREADING_LAYER``, None where unset), or None
    where nothing known does: compcoll's kernels run on rank threads and ordering threads, off the main one.

    1. Unset, or ``LAYER``: nothing.
    2. Any other name may resolve to TBB's layer, under which a process whose parallel kernels first ran off the
       main thread hung at exit (numba#10556, oneTBB 2022.3 and newer: the suite under it, 2026-12-06), or to
       OpenMP's, under which torchrun jobs holding torch's OpenMP runtime aborted at exit now and then.
    """
    if chosen is None or chosen == LAYER:
        return None
    return (f"compcoll: NUMBA_THREADING_LAYER={chosen!r}: compcoll's CPU kernels run off the main thread, where "
            "Numba's TBB layer makes the process hang at exit (numba#10556) and its OpenMP layer aborted torchrun "
            f"jobs at exit now and then; unset it (compcoll sets {LAYER!r}) or set it to {LAYER!r}")


if "NUMBA_THREADING_LAYER" in os.environ:
    _WARNING = layer_warning(os.environ["NUMBA_THREADING_LAYER"])
    if _WARNING is not None:
        warnings.warn(_WARNING, RuntimeWarning, stacklevel=2)
else:
    numba.config.THREADING_LAYER = LAYER

SERIAL: dict[str, object] = {}
"""Each threaded kernel's serial twin (the same function, its prange run as range), by name."""


def threaded(fn):
    """Compile ``fn`` threaded over its blocks, and its serial twin into ``SERIAL``.

    A threaded kernel's parallel regions are its own ``prange`` loops, none inside another loop: Numba makes any
    array expression beside them (a slice copied, ``np.zeros``, an array's product) a parallel loop of its own, and
    each one run wakes Numba's threads (97-110 us a parallel loop on the 2-core machine:
    ``tests/kernels/test_cpu.py::test_every_parallel_region_is_a_prange_outside_any_loop``).

    The twin is a copy of ``fn`` under another qualified name: Numba's on-disk cache names
    its files after the function and keys their entries by signature alone, so two
    dispatchers of one function would overwrite each other's entries, and a later process
    would load the threaded code for both (or the serial code for both).
    """
    twin = types.FunctionType(fn.__code__, fn.__globals__, fn.__name__ + "_serial", fn.__defaults__)
    twin.__qualname__ = fn.__qualname__ + "_serial"
    SERIAL[fn.__name__] = njit(cache=True, nogil=True)(twin)
    return njit(parallel=True, cache=True, nogil=True)(fn)


load = njit(cache=True, inline="always")(scalar.load)
larger_or_nan = njit(cache=True, inline="always")(scalar.larger_or_nan)
power_of = njit(cache=True, inline="always")(scalar.power)
threshold = njit(cache=True, inline="always")(scalar.threshold)
block_scale = njit(cache=True, inline="always")(scalar.block_scale)
nearest_code = njit(cache=True, inline="always")(scalar.nearest_code)

GATHER = np.uint64(0x8040201008040201)
"""Times the 8 flag bytes (0/1) of a little-endian uint64, it puts flag j at bit 63 - j and nothing
else at bits 56-63: the top byte is the 8 flags packed, the first in the most significant bit."""

SPREAD = np.uint64(0x0101010101010101)
"""Times a byte, it copies the byte into all 8 bytes of a uint64."""

SELECT = np.uint64(0x0102040810204080)
"""Masks byte j of a spread byte down to its bit 7 - j: nonzero exactly where element j's sign bit is set."""

_TOP = np.uint64(56)


@njit(cache=True, inline="always")
def pack(flags, out):
    """out[k] <- flags[8k .. 8k+7] (bytes 0/1), the first in the most significant bit: one multiply per byte
    (``GATHER``)."""
    words = flags.view(np.uint64)
    for k in range(out.size):
        out[k] = np.uint8((words[k] * GATHER) >> _TOP)


@njit(cache=True, inline="always")
def unpack(bits, flags):
    """flags[8k + j] <- nonzero where bit 7 - j of bits[k] is set, else 0 (``SPREAD``, ``SELECT``); flags holds
    >= 8 * bits.size."""
    words = flags.view(np.uint64)
    for k in range(bits.size):
        words[k] = (np.uint64(bits[k]) * SPREAD) & SELECT


@njit(cache=True, inline="always")
def add_signs(acc, flags, w, first):
    """acc[e] += w where flags[e] is set, else -w, in float32 (every product of a sign is exact); where ``first``,
    acc[e] <- 0 + +-w instead, acc unread: the sum from zero without zeroing it first (a zero weight's -w gives +0,
    as 0 - 0 does)."""
    if first:
        zero = np.float32(0)
        for e in range(acc.size):
            acc[e] = zero + (w if flags[e] else -w)
    else:
        for e in range(acc.size):
            acc[e] += w if flags[e] else -w


@njit(cache=True, inline="always")
def store_sum(acc, base, lo, out):
    """out[lo + e] <- acc[e] + base[lo + e] in float32 (``base`` None: acc[e]) through slices from zero; ``base`` may
    be ``out`` itself."""
    dest = out[lo:lo + acc.size]
    if base is None:
        for e in range(acc.size):
            dest[e] = acc[e]
    else:
        added = base[lo:lo + acc.size]
        for e in range(acc.size):
            dest[e] = acc[e] + added[e]


@njit(cache=True, inline="always")
def set_head(rows, r, value, head):
    """rows[r, :SCALE_BYTES] <- the bytes of float32 ``value`` (a wire row's head), through ``head`` (a one-element
    float32 scratch), a byte at a time: a slice copied would be a parallel loop of its own in a threaded kernel
    (``threaded``)."""
    head[0] = value
    head_bytes = head.view(np.uint8)
    for j in range(SCALE_BYTES):
        rows[r, j] = head_bytes[j]


@njit(cache=True, inline="always")
def head_value(rows, r, head):
    """The float32 at the head of wire row r (``set_head``'s), through ``head`` (a one-element float32 scratch), a
    byte at a time."""
    head_bytes = head.view(np.uint8)
    for j in range(SCALE_BYTES):
        head_bytes[j] = rows[r, j]
    return head[0]


@njit(cache=True, inline="always")
def row_task(t, tasks_per_row, per_task, row_bytes, n_src):
    """Task t of rows of ``row_bytes`` packed bytes, ``per_task`` bytes a task (``tasks_per_row`` a row): its row r,
    its bytes [lo, hi) of the row, its first element in the whole, its count of elements, and how many of them,
    from the first, have a source (lie below ``n_src``)."""
    r = t // tasks_per_row
    lo = (t % tasks_per_row) * per_task
    hi = min(row_bytes, lo + per_task)
    first = (r * row_bytes + lo) * 8
    count = (hi - lo) * 8
    return r, lo, hi, first, count, min(count, max(0, n_src - first))


@njit(cache=True, inline="always")
def block_bounds(k, block, count, valid):
    """Block k of a task's ``count`` elements, ``block`` a block (the last one shorter), ``valid`` of them with a
    source: its first element and its end, the end of its elements with a source, and the first of those past
    them."""
    first = k * block
    end = min(count, first + block)
    return first, end, min(end, valid), max(first, valid)


@njit(cache=True, inline="always")
def segment_task(t, tasks_per_segment, length, n_out):
    """Task t of segments of ``length`` elements laid end to end, ``tasks_per_segment`` tasks of up to BLOCK elements
    each: its segment, its first element in the segment and in the whole, and its count (cut at n_out: <= 0 past
    it)."""
    segment = t // tasks_per_segment
    lo = (t % tasks_per_segment) * BLOCK
    first = segment * length + lo
    return segment, lo, first, min(BLOCK, length - lo, n_out - first)
