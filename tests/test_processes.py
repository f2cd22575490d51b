"""Ending a local job's processes: mpiexec is asked first and removes its own files; what refuses is killed."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from typing import Iterator

from compcoll.launcher import rank_commands
from compcoll.processes import descendants, end_processes
from tests.leftovers import segments, topology_files
from tests.pool import _running

IGNORES_SIGTERM = """
import signal, subprocess, sys, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
print(child.pid, flush=True)
time.sleep(120)
"""


@contextlib.contextmanager
def session(command: list[str], env: dict[str, str] | None = None) -> Iterator[subprocess.Popen]:
    """``command`` started in a session of its own, its output piped; whatever is left of it is killed after."""
    proc = subprocess.Popen(command, env=env, start_new_session=True, stdout=subprocess.PIPE, text=True)
    try:
        yield proc
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        proc.stdout.close()


def sleeps(comm, seconds: float) -> None:
    print("ready", flush=True)
    time.sleep(seconds)


def test_an_mpiexec_job_ends_and_leaves_no_topology_file() -> None:
    """Two launched MPI ranks asleep end well within the grace, and Hydra's topology file is gone with them (SIGKILL
    alone left one each time)."""
    before, before_segments = topology_files(), segments()
    [(command, env)] = rank_commands("tests.test_processes:sleeps", 2, "mpi", args=(120,))
    with session(command, env) as job:
        assert _readies(job, 2) == 2
        assert topology_files() - before, "mpiexec wrote no topology file: nothing to check"
        tree = descendants([job.pid])
        start = time.monotonic()
        end_processes([job], grace=30.0)
        assert time.monotonic() - start < 15
        assert job.wait(timeout=5) is not None and len(tree) == 4  # mpiexec, its proxy, 2 ranks
    assert not any(_running(pid) for pid in tree)
    assert topology_files() <= before and segments() <= before_segments


def _readies(job: subprocess.Popen, ranks: int) -> int:
    """The "ready" lines of ``ranks`` ranks read from ``job``'s output (mpiexec forwards the ranks' writes as they
    come, so two ranks' lines may arrive as "readyready" and an empty line), up to its end."""
    seen = ""
    while seen.count("ready") < ranks:
        line = job.stdout.readline()
        if not line:
            break
        seen += line
    return seen.count("ready")


def test_a_process_that_ignores_sigterm_is_killed_with_its_children() -> None:
    """A process that ignores SIGTERM, and the child it started, are killed once the grace is over."""
    with session([sys.executable, "-c", IGNORES_SIGTERM]) as proc:
        child = int(proc.stdout.readline())
        start = time.monotonic()
        end_processes([proc], grace=0.5)
        assert proc.wait(timeout=10) is not None and time.monotonic() - start >= 0.5
        deadline = time.monotonic() + 10
        while _running(child) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _running(child)
