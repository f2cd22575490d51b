"""A local job's processes: find them in ``/proc``, have its Python ranks print their stacks, and end them all."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Iterable

STACKS_SIGNAL = signal.SIGUSR1
"""The signal on which a rank prints every thread's Python stack to its output (``faulthandler``): sent to the ranks
still running at a timeout, before they are killed, so the failure says where each one was."""
STACKS_WAIT_S = 2.0
"""How long the ranks get to print their stacks."""
STACKS_GAP_S = 0.2
"""How long one rank gets to print its stacks before the next is asked: under mpiexec the ranks share one output,
and two dumps at once came out interleaved mid-line (2026-12-02)."""


def descendants(roots: Iterable[int]) -> list[int]:
    """Processes ``roots`` and all their descendants (under mpiexec: Hydra's proxies, then the ranks), from
    ``/proc``; those that end meanwhile are left out."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        stat = proc_stat(f"/proc/{entry}/stat") if entry.isdigit() else None
        if stat is not None:
            children.setdefault(int(stat[1][1]), []).append(int(entry))
    pending, found = list(roots), []
    while pending:
        pid = pending.pop()
        found.append(pid)
        pending.extend(children.get(pid, ()))
    return found


def proc_stat(path: str) -> tuple[str, list[str]] | None:
    """A process's or thread's ``stat`` file (``/proc/<pid>/stat``, ``/proc/<pid>/task/<tid>/stat``): its name and
    the fields after it (state, parent, ..., user and system CPU ticks at 11 and 12); None once it has ended. The
    name is cut at the last ")", since a name may hold spaces and parentheses."""
    try:
        text = Path(path).read_text()
    except OSError:
        return None
    name, fields = text.split("(", 1)[1].rsplit(")", 1)
    return name, fields.split()


def print_stacks(pids: Iterable[int], wait: float = STACKS_WAIT_S) -> None:
    """Have the Python processes among ``pids`` (the ranks: not mpiexec or its proxies, which the signal would end)
    print every thread's stack to their output (``STACKS_SIGNAL``), one at a time (``STACKS_GAP_S`` each), and give
    them ``wait`` seconds in all, at the least."""
    start, signalled = time.monotonic(), False
    for pid in pids:
        stat = proc_stat(f"/proc/{pid}/stat")
        if stat is not None and stat[0].startswith("python"):
            with contextlib.suppress(OSError):
                if signalled:
                    time.sleep(STACKS_GAP_S)
                os.kill(pid, STACKS_SIGNAL)
                signalled = True
    if signalled:
        time.sleep(max(STACKS_GAP_S, wait - (time.monotonic() - start)))


END_GRACE_S = 2.0
"""How long a job's started processes get to end on SIGTERM before their process groups are killed."""


def end_processes(procs: Iterable[subprocess.Popen], grace: float = END_GRACE_S) -> None:
    """End processes started each in a session of its own (``start_new_session``), and everything they started.

    1. Send SIGTERM to each one still running: mpiexec then ends its ranks and removes its own files (Hydra's
       ``/tmp/hydra_hwloc_xmlfile_*``, which SIGKILL left behind, one each time), a rank ends.
    2. Wait up to ``grace`` seconds in all for them to exit.
    3. Send SIGKILL to each one's process group: whatever is left of it (a rank mpiexec did not end, a child).
    """
    procs = list(procs)
    for proc in procs:
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    for proc in procs:
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=max(0.0, deadline - time.monotonic()))
    for proc in procs:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
