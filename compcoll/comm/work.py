"""Work: the handle of a started collective (torch.distributed's convention): wait, is_completed, get_future."""

from __future__ import annotations

import threading
import time
import traceback
from abc import ABC, abstractmethod
from types import BuiltinFunctionType
from typing import TYPE_CHECKING, Any, Callable, NoReturn

import torch

from ..errors import CollectiveTimeout

if TYPE_CHECKING:
    from .base import Communicator


class Work(ABC):
    """A collective in flight on this rank.

    ``wait`` returns its result (the output tensor) or raises its error; the same error
    reaches every rank, since every rank runs the same checks (see docs/architecture.md,
    "Ordering and Work"). A ``wait`` that runs out of time raises ``CollectiveTimeout``
    and leaves the communicator unusable: a half-done collective cannot be taken back.
    """

    @abstractmethod
    def wait(self, timeout: float | None = None) -> Any:
        """Block until the collective completes (at most ``timeout`` seconds more); return its result."""

    @abstractmethod
    def is_completed(self) -> bool:
        """Whether the collective has completed (successfully or not); never blocks."""

    @abstractmethod
    def get_future(self) -> torch.futures.Future:
        """A ``torch.futures.Future`` completed with the result (or the error) without anyone waiting."""


class DoneWork(Work):
    """A collective that completed when it was started (one rank, or nothing to send)."""

    def __init__(self, result: Any = None) -> None:
        self._result = result

    def wait(self, timeout: float | None = None) -> Any:
        return self._result

    def is_completed(self) -> bool:
        return True

    def get_future(self) -> torch.futures.Future:
        future: torch.futures.Future = torch.futures.Future()
        future.set_result(self._result)
        return future


class PendingWork(Work):
    """A transport operation in flight, polled until it completes or its deadline passes.

    1. ``comm.timeout`` seconds from its start (or ``wait``'s own ``timeout``, if shorter)
       bound every wait.
    2. On completion ``finish`` runs once (a staged copy back), then ``result`` is returned.
    3. A timeout or a transport error marks the communicator broken.
    4. The communicator holds it until it completes, even once its handle is dropped (``Communicator._track``).
    5. The time spent blocked in ``wait`` is added to the communicator's ``wait_seconds``.

    Subclasses say how to test and how to block (``_test``, ``_block``), and, where the
    transport can tell (point-to-point exchanges), which ranks' parts have not arrived
    (``_absent``), which a timeout's message then names.
    """

    def __init__(self, comm: "Communicator", what: str, result: Any, finish: Callable[[], None] | None = None) -> None:
        self._comm = comm
        self._what = what
        self._result = result
        self._finish = finish
        self._done = False
        self._started = time.monotonic()
        comm._track(self, started=True)

    @abstractmethod
    def _test(self) -> bool:
        """Whether the operation has completed (non-blocking)."""

    @abstractmethod
    def _block(self, seconds: float) -> bool:
        """Wait up to ``seconds`` for completion; True once it has completed."""

    def _absent(self) -> list[int] | None:
        """The ranks whose part of the operation has not arrived; None where the transport cannot tell."""
        return None

    def is_completed(self) -> bool:
        if not self._done and self._comm._guard(self._test):
            self._complete()
        return self._done

    def wait(self, timeout: float | None = None) -> Any:
        if self._done:
            return self._result
        limit = self._comm.timeout - (time.monotonic() - self._started)
        if timeout is not None:
            limit = min(limit, timeout)
        blocked = time.monotonic()
        completed = self._comm._guard(self._block, max(0.0, limit))
        self._comm._count_wait(time.monotonic() - blocked)
        if not completed:
            absent = self._absent()
            if absent:
                cause = (f"nothing arrived from rank(s) {', '.join(map(str, absent))}: stopped, dead, or not in "
                         f"this call")
            else:
                cause = ("did every rank call it with matching arguments, or did a rank fail or stop before "
                         "reaching it?")
            error = CollectiveTimeout(
                f"{self._comm.describe()} {self._what} on rank {self._comm.rank} of {self._comm.size} did not "
                f"complete within {time.monotonic() - self._started:.3g} s (timeout {self._comm.timeout:g} s, "
                f"COMPCOLL_TIMEOUT): {cause}", absent
            )
            self._comm._mark_broken(error, self)
            raise error
        self._complete()
        return self._result

    def get_future(self) -> torch.futures.Future:
        return self._comm._ordering.submit(self.wait, self._what).get_future()

    def _complete(self) -> None:
        self._done = True
        self._comm._track(self, started=False)
        if self._finish is not None:
            self._comm._guard(self._finish)


class TaskWork(Work):
    """A call run on a communicator's ordering thread (``Ordering.submit``): an algorithm or a waited operation.

    ``on_wait(result)``, if given, runs in the waiting thread before ``wait`` returns (a
    CUDA caller's stream waits there for the algorithm's stream).
    """

    def __init__(self, comm: "Communicator", what: str, on_wait: Callable[[Any], None] | None = None) -> None:
        self._comm = comm
        self._what = what
        self._on_wait = on_wait
        self._done = threading.Event()
        self._lock = threading.Lock()
        self._settled = False
        self._result: Any = None
        self._error: BaseException | None = None
        self._future: torch.futures.Future | None = None
        self._settler: threading.Thread | None = None

    def _settle(self, result: Any, error: BaseException | None) -> threading.Event:
        """Record the outcome and complete the future asked for meanwhile (the ordering thread calls this); return
        the event that wakes the waiters, which the caller sets once it has let go of this Work.

        1. Record the outcome and take the future ``get_future`` made while the call was queued, if any: this
           Work lets go of it.
        2. Complete that future: its callbacks run inside ``set_result``, on this thread, and
           may call ``wait()``: the outcome is recorded before, and ``wait`` on this thread does
           not block.
        3. The caller wakes the other waiters, only after both, so that a program that exits right after its
           ``wait()`` never leaves this thread inside torch's future code (its teardown then aborts: "terminate
           called without an active exception"), and only once it holds neither this Work nor its call: a
           waiter that drops its handle then frees them, with the communicator (the test pool froze each one a
           waiter's case had let go of, while the ordering thread still held it, for the life of the process).
        """
        with self._lock:
            self._result, self._error, self._settled = result, error, True
            future, self._future = self._future, None
        self._settler = threading.current_thread()
        if future is not None:
            complete_future(future, result, error)
        return self._done

    def wait(self, timeout: float | None = None) -> Any:
        if threading.current_thread() is not self._settler and not self._done.wait(timeout):
            error = CollectiveTimeout(
                f"{self._what} on rank {self._comm.rank} of {self._comm.size} did not complete within "
                f"wait(timeout={timeout:g}); the communicator is no longer usable"
            )
            self._comm._mark_broken(error, self)
            raise error
        if self._error is not None:
            try:
                raise self._error
            finally:
                self = None  # the traceback keeps this frame, which must not keep this Work (as CPython's futures)
        if self._on_wait is not None:
            self._on_wait(self._result)
        return self._result

    def is_completed(self) -> bool:
        return self._done.is_set()

    def get_future(self) -> torch.futures.Future:
        """The future of this call: the one ``_settle`` completes while it is queued, a completed one after.

        A settled Work holds no future. A torch future keeps its error in C++, where Python's garbage
        collector cannot see it; an error raised by ``wait`` has this Work in its traceback (``wait``'s
        frame, and the caller's, which holds the handle). Were the Work to hold a future with that
        error, the cycle would never be collected: every failed call would keep its communicator, its
        plans and its tensors for the life of the process.
        """
        with self._lock:
            if not self._settled:
                if self._future is None:
                    self._future = torch.futures.Future()
                return self._future
        future: torch.futures.Future = torch.futures.Future()
        complete_future(future, self._result, self._error)
        return future


def complete_future(future: torch.futures.Future, result: Any, error: BaseException | None) -> None:
    """Complete ``future`` with ``result``, or with ``error`` where there is one, raised afresh by each wait.

    torch's ``set_exception`` keeps the error in C++, where the garbage collector cannot see it, and
    raises that same object from ``wait()`` and ``value()``: the error's traceback then holds the frame
    of torch's ``Future.wait``, whose ``self`` is the future. That cycle is never collected, nor every
    frame the error passed through, with their locals (a caller's handle, communicator and tensors):
    one failed call waited through its future kept them for the life of the process. So:
    1. The future keeps a copy of the error with no traceback, cause or context (``_detached``),
       which no frame can lead back to.
    2. Each ``wait()`` or ``value()`` raises a new copy of it (``_raise_copy``), whose traceback
       holds that future only until the copy is let go of.
    The copies keep the error's type, message and attributes (``RemoteError.failures``,
    ``CollectiveTimeout.absent``); from Python 3.11 a note gives where the error was first raised.
    3. A torch without the private ``_set_unwrap_func`` (which its own ``set_exception`` uses)
       gets ``set_exception``: the cycle above again, never a future left pending, which would
       leave its waiters hanging.
    """
    if error is None:
        future.set_result(result)
        return
    unwrap = getattr(future, "_set_unwrap_func", None)
    if unwrap is None:
        future.set_exception(error)
        return
    unwrap(_raise_copy)
    future.set_result(_detached(error))


def _detached(error: BaseException) -> BaseException:
    """A copy of ``error``: its type, arguments and attributes, no traceback, cause or context; where it was
    raised is a note (Python 3.11+). ``error`` itself if its type cannot be copied so."""
    try:
        copy = _bare(type(error), error.args)
        copy.__dict__.update({key: list(value) if key == "__notes__" else value
                              for key, value in getattr(error, "__dict__", {}).items()})
    except Exception:  # noqa: BLE001 - a type that refuses to be built from its arguments is kept as it is
        return error
    copy.args = error.args
    if error.__traceback__ is not None and hasattr(copy, "add_note"):
        copy.add_note("compcoll: first raised at\n" + "".join(traceback.format_tb(error.__traceback__)).rstrip())
    return copy


def _bare(cls: type[BaseException], args: tuple) -> BaseException:
    """An instance of ``cls`` made by its ``__new__`` from ``args``, not initialised.

    1. Take each ``__new__`` along ``cls``'s MRO in turn.
    2. One written in Python (``cls``'s own, or a base's) is called, and what it says goes.
    3. A builtin one refuses a type of another memory layout than its own ("RuntimeError.__new__(CollectiveTimeout)
       is not safe": a type with two builtin bases, as ``CollectiveTimeout`` has RuntimeError and TimeoutError,
       is laid out as the larger one, OSError); the next one is tried then.
    TypeError where none makes one.
    """
    for base in cls.__mro__:
        new = vars(base).get("__new__")
        if isinstance(new, BuiltinFunctionType):
            try:
                return new(cls, *args)
            except TypeError:
                continue
        if new is not None:
            return new(cls, *args)
    raise TypeError(f"no __new__ along {cls.__name__}'s bases makes one")


def _raise_copy(error: BaseException) -> NoReturn:
    """A future's unwrap function (``complete_future``): raise a copy of its error."""
    raise _detached(error)
