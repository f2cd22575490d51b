"""Clocks of the GPU benchmarks: the device's time queued or from idle, the host's, and medians of them."""

from __future__ import annotations

import statistics
import time
from typing import Callable

import torch

from ..kernels.launch import COUNTS

Clock = Callable[[Callable[[], object]], float]
"""Seconds that one call of a function takes, by some clock."""


def idle_seconds(fn: Callable[[], object]) -> float:
    """Seconds between two CUDA events around ``fn`` from an idle device: its device work and, where the device
    waits for the host, the host's time to launch it."""
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    fn()
    stop.record()
    stop.synchronize()
    return start.elapsed_time(stop) / 1e3


def host_seconds(fn: Callable[[], object]) -> float:
    """Seconds the host spends in ``fn`` (its call returning, not the device finishing), from an idle device."""
    torch.cuda.synchronize()
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def own_host_seconds(fn: Callable[[], object]) -> float:
    """``host_seconds`` of ``fn`` less the seconds its host waits took (``kernels.launch.COUNTS.waited``): the host's
    own time in it, its Python, launches and copies, without the device's work it waited for (a call's wait for its
    sum is at least that kernel's time, which grows with the tensor)."""
    waited = COUNTS.waited
    seconds = host_seconds(fn)
    return seconds - (COUNTS.waited - waited)


class QueuedClock:
    """Seconds of the device's work that ``fn`` queues, with all of it queued before any of it runs: a kernel's own
    time, as inside a busy training step.

    1. A spin kernel (``torch.cuda._sleep``) holds the stream; the start event, ``fn``'s work and the stop event
       queue behind it, so the events bracket the device's work alone, not the host's time to launch it.
    2. If the spin ended before ``fn`` returned (the start event had completed), the host's time may show: the spin
       doubles and the run is repeated. ``fn`` must not wait for the device (a wait always drains the queue):
       past ``MAX_CYCLES`` it is refused, and the spin starts from ``FIRST_CYCLES`` again.
    """

    FIRST_CYCLES = 1 << 20
    MAX_CYCLES = 1 << 32

    def __init__(self) -> None:
        self.cycles = self.FIRST_CYCLES

    def __call__(self, fn: Callable[[], object]) -> float:
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        while self.cycles <= self.MAX_CYCLES:
            torch.cuda._sleep(self.cycles)
            start.record()
            fn()
            spun_out = start.query()
            stop.record()
            stop.synchronize()
            if not spun_out:
                return start.elapsed_time(stop) / 1e3
            self.cycles *= 2
        self.cycles = self.FIRST_CYCLES
        raise RuntimeError("the function waits for the device (or queues for longer than the spin): it cannot be "
                           "timed queued")


def timed(fn: Callable[[], object], runs: int, warmup: int = 3, clock: Clock = idle_seconds) -> float:
    """Median seconds of ``fn`` by ``clock`` over ``runs`` runs after ``warmup`` calls."""
    for _ in range(warmup):
        fn()
    times = [clock(fn) for _ in range(runs)]
    torch.cuda.synchronize()
    return statistics.median(times)
