"""Which CPU kernel calls run serially: those below the size where waking Numba's threads costs what they save."""

from __future__ import annotations

import os
import statistics
import time
from typing import Callable

import numba
import numpy as np

from .common import SERIAL
from .sums import compensated_power_sum

FLOOR = 1 << 16
"""The least switch ``measured`` gives (the switch's place before 2026-12-06, whatever the machine)."""
CEILING = 1 << 22
"""The largest switch ``measured`` gives: what a measure taken while other threads held the cores costs at worst (3
Python threads spinning on the 2-core VM made the threads' wake 1-5 ms, a switch past 16M by fastest runs; medians
gave 0.19-1.0M there, 0.83-1.11M quiet), where threads ran calls of 4M elements with a scale per 64 1.7x faster."""
SERIAL_BELOW_ENV = "COMPCOLL_SERIAL_BELOW"
"""An environment variable that sets the switch (elements, 0 or more: 0 threads every call) instead of measuring it."""
PROBE = 1 << 16
"""float32 elements of the serial sum ``measured`` times for a kernel's cost per element."""
RUNS = 9
"""Runs of each probe whose median ``measured`` takes."""

ROW_SUMS = frozenset({"accumulate_signs", "accumulate_lanes", "accumulate_blocks", "accumulate_groups",
                      "accumulate_levels", "average_rows"})
"""The kernels whose first argument holds one row per rank, all of which they add up."""
PER_SCALE = frozenset({"code_blocks", "decode_codes"})
"""The kernels whose tensor holds block scales, not elements."""


def from_environment(text: str) -> int:
    """``COMPCOLL_SERIAL_BELOW``'s ``text`` as a number of elements, or ValueError naming the variable where it is not
    one (0 or more)."""
    try:
        count = int(text)
    except ValueError:
        count = -1
    if count < 0:
        raise ValueError(f"compcoll: {SERIAL_BELOW_ENV}={text!r}: give a number of elements, 0 or more")
    return count


_CHOSEN: list[int | None] = [from_environment(os.environ[SERIAL_BELOW_ENV]) if SERIAL_BELOW_ENV in os.environ
                             else None]
"""The switch: ``COMPCOLL_SERIAL_BELOW``'s, read at import (a bad value fails ``import compcoll`` on the rank that
has it, before any collective), then ``use_serial_below``'s; None until ``serial_below`` measures it."""


def serial_below() -> int:
    """Elements below which a CPU kernel runs its serial twin (the same code, so the same bits, on the calling thread).

    ``COMPCOLL_SERIAL_BELOW`` or ``use_serial_below`` sets it; otherwise the first call that asks measures it
    (``measured``), and it is kept. Each threaded kernel wakes Numba's threads once (97-110 us on the 2-core
    development VM, where a serial sum of squares reads 1M float32 elements in about 150 us), so there a one-rank
    ``compressed_allreduce`` ran serially 4.1x faster at 64K elements, 2.6x at 256K and 1.6x at 1M, and threaded
    1.7x faster at 4M with a scale per 64 (2026-12-06). Call it where the CPU kernels' lock is held
    (``codecs.dispatch``): measuring runs kernels.
    """
    if _CHOSEN[0] is None:
        _CHOSEN[0] = measured()
    return _CHOSEN[0]


def serially(count: int) -> bool:
    """Whether a CPU input of ``count`` elements runs the serial twins: below ``serial_below()``, which is not
    measured for an input below ``FLOOR`` (no measure is below it)."""
    if _CHOSEN[0] is None and count < FLOOR:
        return True
    return count < serial_below()


def runs_serially(kernel: str, numel: int, args: tuple) -> bool:
    """Whether the CPU call of ``kernel`` (named as in ``SERIAL``) on a tensor of ``numel`` elements and kernel
    arguments ``args`` runs its serial twin (``serially``), weighing the call's work:
    1. the kernels that add rows up (``ROW_SUMS``: a server's accumulate of n ranks' rows, the exact average):
       ``numel`` (the output's) times the rows of their first argument;
    2. the block scales' coding (``PER_SCALE``): serially below ``FLOOR`` scales, as before the switch was measured
       (or below the switch where it is set lower): a scale costs ``code_blocks`` about 200 times a summed element,
       30 ns on the 2-core VM, so the sums' switch would leave 65,536 scales serial, 1.95 ms against 0.77 threaded;
    3. any other: ``numel``.
    """
    if kernel in PER_SCALE:
        return numel < FLOOR and serially(numel)
    return serially(numel * args[0].shape[0] if kernel in ROW_SUMS else numel)


def use_serial_below(count: int | None) -> int | None:
    """Run CPU inputs of fewer than ``count`` elements serially from now on (None: measure the switch at the next call
    that asks, ``serial_below``); returns the setting before, to put back. ``COMPCOLL_SERIAL_BELOW`` is read at
    import only."""
    if count is not None and (isinstance(count, bool) or not isinstance(count, int) or count < 0):
        raise ValueError(f"compcoll: the serial switch must be a number of elements, 0 or more, or None; got {count!r}")
    previous, _CHOSEN[0] = _CHOSEN[0], count
    return previous


def measured() -> int:
    """The switch for this machine, from two probes of the sum of squares (``compensated_power_sum``), about 1 ms.

    1. The threads' wake: the threaded kernel's median time on 8 elements less its serial twin's.
    2. A kernel's serial cost per element: the serial twin's median time on ``PROBE`` elements, over ``PROBE``.
    3. ``crossover`` of the two at Numba's thread count for the calling thread.
    """
    tiny, tiny_err = np.ones(8, np.float32), np.zeros(8, np.float32)
    probe, probe_err = np.ones(PROBE, np.float32), np.zeros(PROBE, np.float32)
    serial = SERIAL["compensated_power_sum"]
    wake = (_median(lambda: compensated_power_sum(tiny, None, tiny_err, tiny.size, 2))
            - _median(lambda: serial(tiny, None, tiny_err, tiny.size, 2)))
    per_element = _median(lambda: serial(probe, None, probe_err, probe.size, 2)) / PROBE
    return crossover(wake, per_element, numba.get_num_threads())


def crossover(wake: float, per_element: float, threads: int) -> int:
    """The input size where threads save what their wake costs, within [``FLOOR``, ``CEILING``].

    Threads save at most the share 1 - 1 / ``threads`` of a serial kernel's ``per_element`` seconds an element (less
    where memory's bandwidth runs out first), so they pay from wake / (per_element * (1 - 1 / threads)) elements: on
    the 2-core VM 83 us / (0.15 ns * 1/2), 1.1M; ``CEILING`` where there is one thread.
    """
    if threads <= 1 or per_element <= 0:
        return CEILING
    return int(min(CEILING, max(FLOOR, wake / (per_element * (1 - 1 / threads)))))


def _median(run: Callable[[], object]) -> float:
    """Seconds of ``run``'s median run of ``RUNS``, after one untimed."""
    run()
    times = []
    for _ in range(RUNS):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return statistics.median(times)
