"""Ordering and Work in one process: calls start in issue order, results and errors come back through wait()."""

from __future__ import annotations

import gc
import subprocess
import sys
import threading
import time
import weakref
from types import SimpleNamespace

import pytest
import torch

import compcoll
from compcoll.comm import ordering
from compcoll.comm import work as work_module
from compcoll.comm.work import DoneWork


def test_queued_calls_run_in_issue_order_and_a_blocking_call_waits_behind_them() -> None:
    comm = compcoll.SingleComm()
    order: list[int] = []
    gate = threading.Event()
    first = comm.run(lambda: (gate.wait(5), order.append(1), "one")[-1], "first", async_op=True)
    second = comm.run(lambda: (order.append(2), "two")[-1], "second", async_op=True)
    assert not first.is_completed()
    threading.Timer(0.2, gate.set).start()
    assert comm.run(lambda: (order.append(3), "three")[-1], "blocking") == "three"
    assert order == [1, 2, 3]
    assert second.wait() == "two" and first.get_future().wait() == "one"


def test_a_call_with_nothing_queued_runs_on_the_callers_thread() -> None:
    comm = compcoll.SingleComm()
    assert comm.run(threading.get_ident, "inline") == threading.get_ident()
    assert comm.run(threading.get_ident, "queued", async_op=True).wait() != threading.get_ident()


def test_errors_come_back_through_wait_and_the_future() -> None:
    comm = compcoll.SingleComm()

    def fails() -> None:
        raise compcoll.NonFiniteError("deliberate")

    work = comm.run(fails, "fails", async_op=True)
    with pytest.raises(compcoll.NonFiniteError, match="deliberate"):
        work.wait()
    with pytest.raises(compcoll.NonFiniteError):
        work.get_future().wait()
    assert comm.run(lambda: 7, "after") == 7, "an error inside a call broke the ordering"


def _fail_and_wait(how: str) -> list[weakref.ref]:
    """Fail a call queued behind another (its future made before it settled) and one already settled, wait for
    each through ``how``, and return weak references to the communicator and Works. This frame then ends with
    its locals kept, as a caller's frame does: whatever holds it holds them."""
    comm = compcoll.SingleComm()
    gate = threading.Event()

    def fails() -> None:
        raise compcoll.RemoteError("deliberate", {1: "refused"})

    held = comm.run(lambda: gate.wait(5), "gate", async_op=True)
    queued = comm.run(fails, "queued", async_op=True)
    future = queued.get_future()
    gate.set()
    settled = comm.run(fails, "settled", async_op=True)
    with pytest.raises(compcoll.RemoteError):
        settled.wait()
    for work, fut in ((queued, future), (settled, settled.get_future())):
        if how == "then":  # torch turns a callback's error into a RuntimeError that names it (pybind11 marks the
            # error's note there on Python 3.12+: "RemoteError[WITH __notes__]: deliberate")
            with pytest.raises(RuntimeError, match=r"RemoteError(\[WITH __notes__\])?: deliberate"):
                fut.then(lambda done: done.value()).wait()
            continue
        with pytest.raises(compcoll.RemoteError, match="deliberate") as raised:
            if how == "wait":
                work.wait()
                fut.wait()
            else:
                fut.value()
        assert raised.value.failures == {1: "refused"}, "the error lost its attributes"
    return [weakref.ref(x) for x in (comm, held, queued, settled)]


@pytest.mark.parametrize("how", ["wait", "value", "then"])
def test_a_failed_call_leaves_nothing_alive_once_its_handles_are_dropped(how: str) -> None:
    """A failed call's error, raised by wait(), by its future's wait() or value(), or in a callback, holds in its
    traceback the frames it passed through, with their locals (the caller's handle and communicator). Neither the
    Work nor the future may close a cycle through C++ that the garbage collector cannot see: a Work holding a
    future with that error, or a torch future raising the very error it holds (its traceback keeps torch's
    ``Future.wait`` frame, whose ``self`` is the future). Either kept the communicator, its plans and tensors for
    the life of the process: the future's did until 2026-12-02 (a pooled Gloo rank kept each such case's group, and
    its threads)."""
    refs = _fail_and_wait(how)
    gc.collect()
    assert [ref() is None for ref in refs] == [True] * 4, "a failed call kept its communicator or Work alive"


class _LateEvent(threading.Event):
    """An event whose ``set`` returns 0.2 s after it woke the waiters: the setting thread lingers there."""

    def set(self) -> None:
        super().set()
        time.sleep(0.2)


def test_once_wait_returns_the_ordering_thread_holds_nothing_of_the_call(monkeypatch: pytest.MonkeyPatch) -> None:
    """The ordering thread lets go of a call and its Work before it wakes the Work's waiters, so a waiter that then
    drops its handle frees them at once, with what they hold. Until 2026-12-02 it woke them first: the test pool
    froze a case's communicator that the ordering thread still held for an instant, which then could never be
    collected (a 3-rank Gloo case run 8 times on one pool left rank 0 with 26 event loops where 1 belongs)."""
    monkeypatch.setattr(work_module, "threading", SimpleNamespace(**{**vars(threading), "Event": _LateEvent}))
    comm = compcoll.SingleComm()
    work = comm.run(lambda: torch.ones(3), "late", async_op=True)
    assert torch.equal(work.wait(), torch.ones(3))
    settled = weakref.ref(work)
    del work
    gc.collect()
    assert settled() is None, "the ordering thread still held the Work its waiter had dropped"


def test_wait_timeout_raises_and_breaks_the_communicator() -> None:
    """wait(timeout) raises; later calls raise CommunicatorBroken at once, not after the stuck call ends."""
    comm = compcoll.SingleComm()
    gate = threading.Event()
    work = comm.run(lambda: gate.wait(5), "stuck", async_op=True)
    with pytest.raises(compcoll.CollectiveTimeout, match="did not complete within"):
        work.wait(timeout=0.1)
    with pytest.raises(compcoll.CommunicatorBroken):
        comm.barrier()
    with pytest.raises(compcoll.CommunicatorBroken):
        comm.run(lambda: 7, "after")
    gate.set()
    assert work.wait() is True, "a call on a broken communicator waited behind the timed-out call instead of raising"


def test_single_comm_operations_are_complete_when_started() -> None:
    comm = compcoll.SingleComm()
    recv = torch.empty(4)
    work = comm.alltoall(torch.arange(4.0), recv, async_op=True)
    assert isinstance(work, DoneWork) and work.is_completed() and work.wait() is recv
    assert torch.equal(work.get_future().wait(), torch.arange(4.0))


def test_the_ordering_thread_ends_when_idle_and_a_later_call_starts_another(monkeypatch: pytest.MonkeyPatch) -> None:
    """An idle ordering thread ends (it would keep its communicator alive); calls queued after still run, in order."""
    monkeypatch.setattr(ordering, "IDLE_SECONDS", 0.05)
    comm = compcoll.SingleComm()
    first = comm.run(threading.current_thread, "first", async_op=True).wait()
    first.join(timeout=10)
    assert not first.is_alive(), "the ordering thread outlived its idle time"
    order: list[int] = []
    works = [comm.run(lambda i=i: order.append(i), f"call {i}", async_op=True) for i in range(3)]
    for work in works:
        work.wait()
    assert order == [0, 1, 2]


_EXITS = """
import atexit, sys, threading

def report() -> None:
    print("alive at finalization:", sorted(t.name for t in threading.enumerate() if t.name.startswith("compcoll-")))

atexit.register(report)  # before compcoll's own: it runs after

import time
import torch
import torch.distributed as dist
import compcoll
from compcoll.comm import ordering

ordering.EXIT_SECONDS = 600.0
dist.init_process_group("gloo", init_method="file://" + sys.argv[1], rank=0, world_size=1)
comm = compcoll.TorchComm()
x = torch.randn(1000)
compcoll.compressed_allreduce(x, torch.zeros(1000), torch.zeros(1000), comm, async_op=True).get_future().wait()
comm.run(lambda: (time.sleep(0.3), print("the call queued last ran"))[0], "last", async_op=True)
stuck = compcoll.SingleComm()
gate = threading.Event()
try:
    stuck.run(gate.wait, "stuck", async_op=True).wait(timeout=0.1)
except compcoll.CollectiveTimeout:
    print("a broken communicator's call is stuck")
"""


def test_exit_ends_the_ordering_threads_after_their_queued_calls(tmp_path) -> None:
    """At exit each ordering thread runs the calls queued before and ends, before the interpreter finalizes (a
    daemon thread that ran torch code, alive then, can abort the process: a CI run of tests/ddp/lightning_spawn.py
    did, on 2026-12-04); a broken communicator's thread, maybe stuck in its transport, is left to die with the
    process, not waited for. A Gloo world of one: its async compressed allreduce left the thread idle, then a call
    queued and not waited; a SingleComm's call stuck past its wait's timeout."""
    done = subprocess.run([sys.executable, "-c", _EXITS, str(tmp_path / "store")], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.splitlines() == [
        "a broken communicator's call is stuck", "the call queued last ran",
        "alive at finalization: ['compcoll-SingleComm(rank=0, size=1)']"], done.stdout + done.stderr


_FORKS = """
import os, sys, threading, time
import compcoll

comm = compcoll.SingleComm()
comm.run(lambda: None, "starts the ordering thread", async_op=True).wait()
held, release = threading.Event(), threading.Event()

def hold() -> None:
    with comm._ordering._lock:  # as the ordering thread holds it, for an instant, between two calls
        held.set()
        release.wait()

threading.Thread(target=hold).start()
held.wait()
child = os.fork()
if child == 0:
    sys.exit(3)
release.set()
for _ in range(300):
    pid, status = os.waitpid(child, os.WNOHANG)
    if pid:
        print("the child exited with", os.waitstatus_to_exitcode(status))
        break
    time.sleep(0.1)
else:
    os.kill(child, 9)
    print("the child hung at its exit")
"""


def test_a_forked_child_exits_without_its_parents_ordering_threads() -> None:
    """A child forked while another thread of its parent held an ordering's lock exits at once: the ordering threads
    ``stop_at_exit`` ends are its own process's alone (it found that lock held for ever in the child)."""
    done = subprocess.run([sys.executable, "-c", _FORKS], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.splitlines() == ["the child exited with 3"], done.stdout + done.stderr
