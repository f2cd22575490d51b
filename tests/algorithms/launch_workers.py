"""Rank-side bodies of the asynchronous-call tests: Works in flight, errors and timeouts through wait()."""

from __future__ import annotations

import gc
import os
import threading
import time

import numpy as np
import torch

import compcoll
from compcoll.algorithms.plan import MAX_CACHED_PLANS, cached_plans
from compcoll.comm.work import Work
from compcoll.kernels import reference
from tests.shared import world_once
from tests.algorithms.onebit_workers import (
    DTYPES,
    assert_errors_match,
    assert_matches_reference,
    make_input,
    world_inputs,
)


def _expect_from_wait(exc_type: type, fragment: str, work: Work, timeout: float | None = None) -> None:
    try:
        work.wait(timeout)
    except exc_type as exc:
        assert fragment in str(exc), f"{exc_type.__name__} message {str(exc)!r} lacks {fragment!r}"
    else:
        raise AssertionError(f"expected {exc_type.__name__} ({fragment}) from wait({timeout})")


def in_flight(comm: compcoll.Communicator, shapes: list[list[int]], steps: int) -> None:
    """Several asynchronous calls in flight, a blocking one queued behind them, all equal to the reference.

    Per dtype and step: one compressed_allreduce per shape (each with its own buffers,
    kept across steps), the compensated hierarchical form and Birder's form are started
    asynchronously; a blocking Birder call follows; the Works are then waited on in
    reverse order (one through its future) and every output and error buffer checked.
    """
    n, rank = comm.size, comm.rank
    for dtype in DTYPES:
        state: dict[tuple[int, ...], list] = {}
        hier_state: list = []
        for step in range(steps):
            pending = []
            for shape in map(tuple, shapes):
                full = compcoll.padded_numel(int(np.prod(shape)), n)
                we, se, ref_we, ref_se = state.setdefault(shape, [
                    torch.zeros(full), torch.zeros(full // n),
                    [np.zeros(full, np.float32) for _ in range(n)],
                    [np.zeros(full // n, np.float32) for _ in range(n)]])
                xs = world_inputs(comm, step, shape, dtype)
                work = compcoll.compressed_allreduce(xs[rank], we, se, comm, async_op=True)
                outs, ref_we, ref_se, _ = world_once(comm, reference.compressed_allreduce,
                                                     [x.float().reshape(-1).numpy() for x in xs], ref_we, ref_se)
                state[shape][2:] = ref_we, ref_se
                pending.append((work, outs[rank], we, se, ref_we[rank], ref_se[rank], f"{dtype} {shape} step {step}"))

            shape = tuple(shapes[-1])
            xs = world_inputs(comm, step + 50, shape, dtype)
            flat = [x.float().reshape(-1).numpy() for x in xs]
            if not hier_state:
                wn, sn = compcoll.hierarchical_error_numels(flat[0].size, n, 1)
                hier_state[:] = [torch.zeros(wn), torch.zeros(sn), [np.zeros(wn, np.float32) for _ in range(n)],
                                 [np.zeros(sn, np.float32) for _ in range(n)]]
            hwe, hse, ref_hwe, ref_hse = hier_state
            compensated = compcoll.hierarchical_compressed_allreduce(xs[rank], hwe, hse, comm, ranks_per_node=1,
                                                                     async_op=True)
            outs, ref_hwe, ref_hse, _ = world_once(comm, reference.hierarchical_compressed_allreduce, flat, ref_hwe,
                                                   ref_hse, 1)
            hier_state[2:] = ref_hwe, ref_hse
            pending.append((compensated, outs[rank], hwe, hse, ref_hwe[rank], ref_hse[rank], f"hierarchical {dtype}"))
            birder = compcoll.hierarchical_allreduce(xs[rank], comm, ranks_per_node=1, seed=3, step=step,
                                                     async_op=True).get_future()
            blocking = compcoll.hierarchical_allreduce(xs[rank], comm, ranks_per_node=1, seed=4, step=step)
            birder_outs = world_once(comm, reference.hierarchical_allreduce, flat, 1, 4, step)[0]
            assert_matches_reference(blocking, birder_outs[rank], f"blocking behind asynchronous calls, {dtype}")

            for work, want, we, se, ref_we, ref_se, where in reversed(pending):
                assert_matches_reference(work.wait(), want, where)
                assert work.is_completed(), where
                assert_errors_match(we, se, ref_we, ref_se, where)
            birder_outs = world_once(comm, reference.hierarchical_allreduce, flat, 1, 3, step)[0]
            assert_matches_reference(birder.wait(), birder_outs[rank], f"Birder through its future, {dtype}")


def errors_through_wait(comm: compcoll.Communicator) -> None:
    """NaN on one rank and sizes that differ reach every rank through wait(); the communicator stays usable."""
    n, rank = comm.size, comm.rank
    numel = 999
    full = compcoll.padded_numel(numel, n)
    we, se = torch.zeros(full), torch.zeros(full // n)
    x = make_input(rank, 0, (numel,), torch.float32)

    poisoned = x.clone()
    if rank == n - 1:
        poisoned[7] = float("nan")
    _expect_from_wait(compcoll.NonFiniteError, f"rank(s) [{n - 1}]",
                      compcoll.compressed_allreduce(poisoned, we, se, comm, async_op=True))
    assert not we.any() and not se.any(), "a failed call changed the error buffers"

    if n > 1:
        other = numel + rank
        other_we = torch.zeros(compcoll.padded_numel(other, n))
        work = compcoll.compressed_allreduce(make_input(rank, 0, (other,), torch.float32), other_we,
                                             torch.zeros(other_we.numel() // n), comm, async_op=True)
        _expect_from_wait(compcoll.RankMismatchError, "sizes differ", work)
        try:
            work.get_future().wait()
        except compcoll.RankMismatchError:
            pass
        else:
            raise AssertionError("the future of a failed call completed with a result")

    xs = world_inputs(comm, 0, (numel,), torch.float32)
    outs, _, _, _ = world_once(comm, reference.compressed_allreduce, [v.numpy() for v in xs],
                               [np.zeros(full, np.float32)] * n, [np.zeros(full // n, np.float32)] * n)
    out = compcoll.compressed_allreduce(x, we, se, comm, async_op=True).wait()
    assert torch.equal(out, torch.from_numpy(outs[rank])), "the communicator is not usable after the errors"


def wait_timeout(comm: compcoll.Communicator, delay: float) -> None:
    """The last rank never joins: wait(timeout) raises CollectiveTimeout in time (a twelfth of the communicator's
    timeout, checked against half of it: CI's two busy cores take a while), and the communicator is then broken."""
    comm.timeout = delay
    numel = 100
    full = compcoll.padded_numel(numel, comm.size)
    if comm.rank == comm.size - 1:
        time.sleep(2 * delay)
        return
    work = compcoll.compressed_allreduce(torch.randn(numel), torch.zeros(full), torch.zeros(full // comm.size), comm,
                                         async_op=True)
    assert not work.is_completed()
    start = time.monotonic()
    _expect_from_wait(compcoll.CollectiveTimeout, "did not complete within", work, delay / 12)
    assert time.monotonic() - start < delay / 2, "wait(timeout) fired late"
    try:
        comm.barrier()
    except compcoll.CommunicatorBroken as exc:
        assert "unusable" in str(exc), exc
    else:
        raise AssertionError("a communicator whose call timed out was still usable")
    while not work.is_completed():
        time.sleep(0.05)


def _rss_mib() -> float:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS in /proc/self/status")


def _works() -> list[Work]:
    gc.collect()
    return [obj for obj in gc.get_objects() if isinstance(obj, Work)]


def _unfinished_works(earlier: list[Work]) -> int:
    """Works not completed, leaving out ``earlier`` (those of an earlier test body in this process)."""
    old = {id(work) for work in earlier}
    return sum(1 for work in _works() if id(work) not in old and not work.is_completed())


def bounded_resources(comm: compcoll.Communicator, calls: int, warm: int, growth_mib: float) -> None:
    """``calls`` calls over many sizes keep memory, threads, plans and pending Works bounded.

    Each call draws (the same on every rank) a size among 300 between 1 and 6000 elements
    (more than the plan cache holds), a protocol, and whether it runs blocking, through
    ``async_op=True`` (every third call, up to 4 in flight) or through a
    ``CompressedAllreduce`` of 8 keys (each with its own size). RSS and thread counts are taken after ``warm``
    calls and at the end; after the last wait no Work is left unfinished.
    """
    earlier = _works()
    rng = np.random.default_rng(2024)
    sizes = rng.choice(np.arange(1, 6001), 300, replace=False)
    stateful = compcoll.CompressedAllreduce(comm)
    buffers: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
    in_flight: list[Work] = []
    before = None
    for call in range(calls):
        if call == warm:
            for work in in_flight:
                work.wait()
            in_flight.clear()
            before = _rss_mib(), threading.active_count(), len(os.listdir("/proc/self/task"))
        numel = int(sizes[rng.integers(len(sizes))])
        protocol = ("gather_scatter", "allgather")[int(rng.integers(2))]
        x = torch.randn(numel)
        if call % 7 == 0:
            key = call % 56 // 7
            stateful(torch.randn(int(sizes[key])), key=key)
            continue
        full = compcoll.padded_numel(numel, comm.size)
        if numel not in buffers:
            buffers[numel] = (torch.zeros(full), torch.zeros(full // comm.size))
        we, se = buffers.pop(numel) if call % 3 == 0 else buffers[numel]
        if call % 3 == 0:
            in_flight.append(compcoll.compressed_allreduce(x, we, se, comm, protocol=protocol, async_op=True))
            if len(in_flight) == 4:
                in_flight.pop(0).wait()
        else:
            compcoll.compressed_allreduce(x, we, se, comm, protocol=protocol)
    for work in in_flight:
        work.wait()
    in_flight.clear()
    after = _rss_mib(), threading.active_count(), len(os.listdir("/proc/self/task"))
    print(f"rank {comm.rank}: {calls} calls, RSS {before[0]:.1f} MiB after {warm} -> {after[0]:.1f} MiB; "
          f"threads {before[1]}/{before[2]} -> {after[1]}/{after[2]}; plans cached {cached_plans(comm)}", flush=True)
    assert after[0] - before[0] < growth_mib, f"RSS grew {after[0] - before[0]:.1f} MiB over {calls - warm} calls"
    assert after[1:] == before[1:], f"threads (Python / OS) went from {before[1:]} to {after[1:]}"
    assert cached_plans(comm) <= MAX_CACHED_PLANS
    assert _unfinished_works(earlier) == 0, "a Work is still unfinished after every call was waited on"
