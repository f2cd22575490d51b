"""Ordering: a communicator's collectives start in the order this rank issued them, some on a background thread."""

from __future__ import annotations

import atexit
import os
import queue
import threading
import time
import weakref
from typing import TYPE_CHECKING, Any, Callable

from .work import TaskWork

IDLE_SECONDS = 1.0
"""How long an ordering thread waits for a next call before it ends."""

EXIT_SECONDS = 5.0
"""How long the interpreter's exit waits, all ordering threads together, for the calls queued before it
(``stop_at_exit``)."""

_ORDERINGS: "weakref.WeakSet[Ordering]" = weakref.WeakSet()
"""Every ordering alive that has started a thread in this process, for ``stop_at_exit``. A forked child starts with
none: its parent's threads are not its own, and a lock one of them held at the fork stays held in the child."""
os.register_at_fork(after_in_child=_ORDERINGS.clear)

if TYPE_CHECKING:
    from .base import Communicator


class Ordering:
    """Issues one communicator's collectives one at a time, in this rank's program order.

    Ranks pair their collectives up by order, so an asynchronous call must not let a
    later call overtake it. Every collective therefore passes through here:
    1. A call made while nothing is queued runs at once on the caller's thread (no
       thread hop for blocking calls: their latency stays the transport's).
    2. ``submit`` queues a call for the ordering thread (one per communicator, a daemon
       started on first use), which runs the queue first in, first out; a call made while
       the queue is not empty waits its turn there. The thread ends once the queue has been
       empty for ``IDLE_SECONDS`` (the next ``submit`` starts another), so that a
       communicator no longer used is not kept alive by its thread, nor its transport's
       resources (a Gloo process group's threads and sockets) with it. The ordering holds
       its communicator weakly for the same reason: whoever calls it holds it (a
       sub-communicator, which shares its parent's ordering, holds its parent). At the
       interpreter's exit the thread ends once the calls queued before have run
       (``stop_at_exit``): a daemon thread that has run torch code and is still alive when
       the interpreter finalizes can abort the process (pytorch/pytorch#38228).
    3. A call made from inside a running call (an algorithm's own transport operations)
       runs directly: it is already in its turn.
    So the transport is entered by one thread at a time (MPI_THREAD_SERIALIZED is enough).
    """

    def __init__(self, comm: "Communicator") -> None:
        self._comm = weakref.ref(comm)
        self._name = f"compcoll-{comm!r}"
        self._lock = threading.RLock()
        self._queued = 0
        self._calls: "queue.SimpleQueue[tuple[Callable[[], Any], TaskWork] | None]" = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._local = threading.local()

    def _inside(self) -> bool:
        return getattr(self._local, "inside", False)

    def run(self, call: Callable[[], Any], what: str) -> Any:
        """Run ``call`` in its turn and return its result (blocking)."""
        if self._inside():
            return call()
        with self._lock:
            if self._queued == 0:
                self._local.inside = True
                try:
                    return call()
                finally:
                    self._local.inside = False
        return self.submit(call, what).wait()

    def start(self, start: Callable[[], Any], what: str) -> Any:
        """Start a transport operation in its turn: at once when nothing is queued, else queued and waited there.

        Returns the operation's Work.
        """
        if self._inside():
            return start()
        with self._lock:
            if self._queued == 0:
                return self.run(start, what)
            return self.submit(lambda: start().wait(), what)

    def submit(self, call: Callable[[], Any], what: str, on_wait: Callable[[Any], None] | None = None) -> TaskWork:
        """Queue ``call`` for the ordering thread; return its Work (the transport must allow
        calls from another thread: ``Communicator._check_threads``)."""
        comm = self._comm()
        comm._check_threads()
        work = TaskWork(comm, what, on_wait)
        with self._lock:
            self._queued += 1
            self._calls.put((call, work))
            if self._thread is None:
                self._thread = threading.Thread(target=self._serve, name=self._name, daemon=True)
                self._thread.start()
                _ORDERINGS.add(self)
        return work

    def stop(self) -> threading.Thread | None:
        """Tell the ordering thread to end once the calls queued before now have run; return it, to be joined (None:
        no thread, or a broken communicator's, which may be stuck inside its transport)."""
        comm = self._comm()
        with self._lock:
            thread = self._thread
            if thread is None or (comm is not None and comm.broken):
                return None
            self._calls.put(None)
        return thread

    def _serve(self) -> None:
        """The ordering thread: run queued calls in order, settling each one's Work.

        1. Take the next call, waiting up to ``IDLE_SECONDS``.
        2. None came, or ``stop``'s None: end, unless a call was queued meanwhile (``_queued`` counts the
           calls queued and not yet settled, under the lock ``submit`` holds to start a thread).
        3. Run it and settle its Work with its result or error; let go of both, and only then wake the Work's
           waiters (``TaskWork._settle``).
        """
        self._local.inside = True
        while True:
            try:
                item = self._calls.get(timeout=IDLE_SECONDS)
            except queue.Empty:
                item = None
            if item is None:
                with self._lock:
                    if self._queued == 0:
                        self._thread = None
                        return
                continue
            call, work = item
            result: Any = None
            error: BaseException | None = None
            try:
                result = call()
            except BaseException as exc:  # every error, to be raised from the caller's wait()
                error = exc
            with self._lock:
                self._queued -= 1
            done = work._settle(result, error)
            del item, call, work, result, error  # a settled call must not keep its communicator alive while this waits
            done.set()


@atexit.register
def stop_at_exit() -> None:
    """At the interpreter's exit, before it finalizes: end every ordering thread.

    1. Tell each ordering's thread to end after the calls queued before (``Ordering.stop``).
    2. Join them, ``EXIT_SECONDS`` for all together; a thread still busy then stays a daemon.
    An idle thread ends at once. A daemon thread that has run torch code and is alive while the interpreter
    finalizes may be ended inside torch's C++ (CPython ends such a thread with ``pthread_exit``), which aborts the
    process ("terminate called without an active exception", pytorch/pytorch#38228). A rank of
    tests/ddp/lightning_spawn.py aborted so once in CI; 2 Gloo ranks training a DDP model with ``onebit_hook`` and
    exiting right after their last backward aborted so in 4 of 15 runs (the ordering thread still inside torch's
    future code, which DDP's wait had left), in none of 45 since.
    """
    threads = [thread for thread in (ordering.stop() for ordering in list(_ORDERINGS)) if thread is not None]
    deadline = time.monotonic() + EXIT_SECONDS
    for thread in threads:
        thread.join(max(0.0, deadline - time.monotonic()))
