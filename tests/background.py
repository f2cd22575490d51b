"""Long checks run as background commands at the lowest CPU priority, on the cores the other tests leave idle.

From the moment the session's tests are collected, one job after another (one process, or a launch of ranks); the
tests that own a job run last and collect its outcome.

A test marks itself with ``@job(make, ...)``, where ``make(folder)`` returns the job's commands (run side by side)
and the variables they need set over the session's environment as collected (``environment()``), given a new folder
of the job's own for its files; ``tests/conftest.py`` queues the jobs of the collected tests and moves their tests to
the end of the session, and a test calls ``results(make)``, which starts its job at once if it has not started (a
test run on its own, or a queue that has not reached it) and waits for it. Several tests may read one job's outcome.

A job must not move bytes between processes: tests that count what a network interface carries
(``tests/bench/test_peers.py``, on the loopback) would count its traffic too.
"""

from __future__ import annotations

import atexit
import os
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from typing import Callable, NamedTuple

ROOT = Path(__file__).resolve().parents[1]
_SESSION_ENV = dict(os.environ)
"""The environment as it was when the tests were collected, before any test ran: a job starts while other tests run,
and a test may change ``os.environ`` for a while (``monkeypatch.setenv``); a job that copied it then ran under that
test's ``COMPCOLL_RANKS_PER_NODE=3``, and its 2-rank cases failed (2026-12-01)."""
Maker = Callable[[Path], tuple[list[list[str]], dict[str, str]]]
"""A job's maker: given its folder, its commands and the variables they need over ``environment()``."""


class Outcome(NamedTuple):
    """One command's return code, standard output and standard error."""

    returncode: int
    output: str
    errors: str


def environment() -> dict[str, str]:
    """A copy of the session's environment as collected (``_SESSION_ENV``), for a job's maker to read from."""
    return dict(_SESSION_ENV)


class Finished(NamedTuple):
    """A job's outcomes, one per command, the environment they ran in, and the job's folder."""

    outcomes: list[Outcome]
    env: dict[str, str]
    folder: Path


class _Job:
    """One job's commands, started side by side under ``nice -n 19``, each a session of its own whose scheduling
    group is niced too (``_lowest_group_priority``), their output in files (a pipe would fill and stop a command
    whose test has not come yet)."""

    def __init__(self, make: Maker) -> None:
        self.folder = Path(tempfile.mkdtemp(prefix="compcoll-job-"))
        atexit.register(shutil.rmtree, self.folder, ignore_errors=True)
        commands, variables = make(self.folder)
        self.env = {**_SESSION_ENV, **variables}
        self.files = [(tempfile.TemporaryFile(mode="w+"), tempfile.TemporaryFile(mode="w+")) for _ in commands]
        self.processes = [subprocess.Popen(["nice", "-n", "19", *command], cwd=ROOT, env=self.env, text=True,
                                           stdout=out, stderr=err, start_new_session=True)
                          for command, (out, err) in zip(commands, self.files)]
        for process in self.processes:
            _lowest_group_priority(process.pid)

    def wait(self, timeout: float | None = None) -> None:
        """Wait for every command (``subprocess.TimeoutExpired`` after ``timeout`` s in all)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        for process in self.processes:
            process.wait(timeout=None if deadline is None else max(0.0, deadline - time.monotonic()))

    def finished(self) -> Finished:
        """Every command's outcome, once all have ended."""
        outcomes = []
        for process, files in zip(self.processes, self.files):
            texts = []
            for file in files:
                file.seek(0)
                texts.append(file.read())
            outcomes.append(Outcome(process.returncode, *texts))
        return Finished(outcomes, self.env, self.folder)

    def stop(self) -> None:
        """Kill each command with every process of its session (a launcher's ranks too)."""
        for process in self.processes:
            try:
                os.killpg(process.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            process.wait()


WARMED = threading.Event()
"""Set once the session has compiled the kernels into Numba's cache (``tests/conftest.py``); until then only
``cold`` jobs start, so that the others' ranks load the kernels instead of compiling them again."""
_LOCK = threading.Lock()
_QUEUE: list[Maker] = []
_JOBS: dict[Maker, _Job] = {}
_DONE: dict[Maker, Finished] = {}


def _lowest_group_priority(pid: int) -> None:
    """Give the session of process ``pid`` the lowest priority as a scheduling group.

    Where the kernel groups each session's processes (``/proc/sys/kernel/sched_autogroup_enabled``), a process's
    nice value ranks it only within its session, and the sessions share the cores alike: a job niced inside the
    test process's session took a third of the cores from the pools' ranks (sessions of their own). So each job
    is a session of its own whose group is niced too; where there are no such groups there is nothing to do.
    """
    try:
        Path(f"/proc/{pid}/autogroup").write_text("19")
    except OSError:
        pass


def job(*makes: Maker) -> Callable:
    """Mark a test as owning the jobs ``makes`` describe (a parametrised test reads one per case)."""
    def mark(test: Callable) -> Callable:
        test.background_jobs = makes
        return test
    return mark


def cold(make: Maker) -> Maker:
    """Mark a job as needing nothing from the session's kernel cache: it may start before ``WARMED``."""
    make.cold = True
    return make


def queue(makes: list[Maker]) -> None:
    """Run ``makes``' jobs one after another, in that order, on a thread of this process."""
    with _LOCK:
        _QUEUE.extend(make for make in dict.fromkeys(makes) if make not in _QUEUE and make not in _JOBS)
    threading.Thread(target=_run_queue, name="background-jobs", daemon=True).start()


def _run_queue() -> None:
    """Start the first job in the queue that may start (``cold``, or any once ``WARMED``), wait for it, repeat."""
    while True:
        with _LOCK:
            if not _QUEUE:
                return
            make = next((m for m in _QUEUE if WARMED.is_set() or getattr(m, "cold", False)), None)
            if make is not None:
                _QUEUE.remove(make)
                started = _JOBS[make] = _Job(make)
        if make is None:
            WARMED.wait(1.0)
        else:
            started.wait()


def _started(make: Maker) -> _Job:
    """``make``'s job, started now if it had not."""
    with _LOCK:
        if make in _QUEUE:
            _QUEUE.remove(make)
        if make not in _JOBS:
            _JOBS[make] = _Job(make)
        return _JOBS[make]


def results(make: Maker, timeout: float) -> Finished:
    """``make``'s job, finished: its commands waited for up to ``timeout`` seconds.

    1. Start the job if it has not started (taking it off the queue).
    2. Wait for its commands; on timeout, stop them and raise ``subprocess.TimeoutExpired``.
    3. Keep the outcome for the other tests that read it, and forget the job (nothing is left to stop).
    """
    if make not in _DONE:
        started = _started(make)
        try:
            started.wait(timeout)
        except subprocess.TimeoutExpired:
            started.stop()
            raise
        _DONE[make] = started.finished()
        with _LOCK:
            _JOBS.pop(make, None)
    return _DONE[make]


@atexit.register
def _stop_all() -> None:
    """Stop the jobs whose tests have not read them (a session stopped early) and run no more."""
    with _LOCK:
        _QUEUE.clear()
        for started in _JOBS.values():
            started.stop()
