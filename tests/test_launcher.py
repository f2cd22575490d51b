"""The multi-process harness reports failures and kills runs that exceed their timeout."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch

from compcoll.launcher import BACKENDS, EPHEMERAL_PORTS, WorkerFailure, _free_port, run, run_threads, seeded
from tests.leftovers import segments, topology_files

ROOT = Path(__file__).resolve().parents[1]


def fails_on_last_rank(comm) -> None:
    if comm.rank == comm.size - 1:
        raise RuntimeError("deliberate failure")


def sleeps(comm, seconds: float) -> None:
    time.sleep(seconds)


@pytest.mark.parametrize("backend", ["mpi", "gloo"])
def test_failure_is_reported(backend: str) -> None:
    """On MPI the failed rank leaves without MPI_Finalize and mpiexec kills the other, and yet no segment of MPICH's
    stays behind in /dev/shm (``compcoll.comm.segments``), nor a topology file of Hydra's in /tmp."""
    before = segments() | topology_files()
    with pytest.raises(WorkerFailure, match="deliberate failure"):
        run("tests.test_launcher:fails_on_last_rank", 2, backend)
    assert segments() | topology_files() <= before


def test_timeout_kills_the_run_and_says_where_each_rank_was() -> None:
    """Past its timeout the run is killed, and first each rank prints its threads' stacks (under mpiexec, whose
    Hydra processes the signal would end, only the ranks get it); the ended ranks leave no segment of MPICH's, and
    mpiexec, asked to end before it is killed (``processes.end_processes``), removes its topology file."""
    before = segments() | topology_files()
    start = time.monotonic()
    with pytest.raises(WorkerFailure, match="timed out") as failure:
        run("tests.test_launcher:sleeps", 2, "mpi", args=(60,), timeout=12)
    assert time.monotonic() - start < 40
    assert segments() | topology_files() <= before
    where = re.findall(r"File \"[^\"]*test_launcher.py\", line \d+ in sleeps", str(failure.value))
    assert len(where) == 2, str(failure.value)[-3000:]


def test_threads_past_their_timeout_say_where_they_are() -> None:
    with pytest.raises(WorkerFailure, match=r"rank\(s\) \[0, 1\] still running after 0.5 s") as failure:
        run("tests.test_launcher:sleeps", 2, "threads", args=(3,), timeout=0.5)
    where = re.findall(r"\[rank \d\] still running at:\n(?:.*\n)*?.*line \d+, in sleeps", str(failure.value))
    assert len(where) == 2, str(failure.value)


def prints_a_lot(comm) -> None:
    print("x" * 200_000, flush=True)
    comm.barrier()


def test_large_output_does_not_block_the_ranks() -> None:
    out = run("tests.test_launcher:prints_a_lot", 3, "gloo", timeout=60)
    assert out.count("x" * 200_000) == 3


@pytest.mark.parametrize("backend", BACKENDS)
def test_each_rank_gets_its_own_prefix_and_environment(backend: str) -> None:
    run("tests.launcher_workers:placed", 3, backend,
        rank_prefix=[["env", f"PREFIXED={r}"] for r in range(3)], rank_env=[{"PLACED": str(r)} for r in range(3)])


def test_seeded_gives_every_thread_the_draws_of_its_own_process() -> None:
    """16 threads drawing under ``seeded(3)`` at once each get what ``torch.manual_seed(3)`` gives one process,
    and the global generator is left as it was."""
    torch.manual_seed(3)
    expected = torch.cat([torch.randn(50) for _ in range(20)])
    torch.manual_seed(11)
    before = torch.get_rng_state()
    drawn: list[torch.Tensor] = []

    def draw() -> None:
        for _ in range(20):
            with seeded(3):
                values = [torch.randn(50) for _ in range(20)]
        drawn.append(torch.cat(values))

    threads = [threading.Thread(target=draw) for _ in range(16)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(drawn) == 16 and all(torch.equal(d, expected) for d in drawn)
    assert torch.equal(torch.get_rng_state(), before)


def test_threads_take_a_function_and_name_it_when_a_rank_fails() -> None:
    seen: list[int] = []
    run_threads(lambda comm: seen.append(comm.rank), 3)
    assert sorted(seen) == [0, 1, 2]
    with pytest.raises(WorkerFailure, match=r"fails_on_last_rank on 2 threads: 1 failed(.|\n)*deliberate failure"):
        run_threads(fails_on_last_rank, 2)


_ONE_CPU = """
import json, os, threading, time, torch, compcoll
from compcoll.launcher import run_threads


def affinities_of_native_threads():
    # once the ranks' ordering threads have ended: the CPUs of every thread Python did not start (Numba's workers)
    deadline = time.monotonic() + 30
    while threading.active_count() > 1 and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.2)
    python = {thread.native_id for thread in threading.enumerate()}
    found = []
    for tid in map(int, os.listdir("/proc/self/task")):
        if tid in python:
            continue
        try:
            found.append(sorted(os.sched_getaffinity(tid)))
        except ProcessLookupError:  # ended since the listing
            continue
    return found


def rank(comm):
    x = torch.randn(70001)  # above the kernels' serial size: their worker threads start if they have not
    full = compcoll.padded_numel(x.numel(), comm.size)
    compcoll.compressed_allreduce(x, torch.zeros(full), torch.zeros(full // comm.size), comm)
    seen.append(sorted(os.sched_getaffinity(0)))

torch.set_num_threads(1)
seen = []
before = sorted(os.sched_getaffinity(0))
run_threads(rank, 3, one_cpu=True)
native = affinities_of_native_threads()
pinned, seen = seen, []
run_threads(rank, 2)
print(json.dumps([before, pinned, seen, sorted(os.sched_getaffinity(0)), native]))
"""


@pytest.mark.skipif(not hasattr(os, "sched_getaffinity") or len(os.sched_getaffinity(0)) < 2,
                    reason="needs thread affinity (Linux) and 2 CPUs")
def test_one_cpu_keeps_the_ranks_to_one_cpu_and_the_kernels_threads_to_all() -> None:
    """In a fresh process (the CPU kernels' worker threads not yet started), with ``one_cpu=True``: every rank
    thread runs on the lowest CPU the caller may use; the caller, and the kernels' worker threads the ranks' first
    large call needed, keep every CPU. Without it the ranks keep every CPU too."""
    done = subprocess.run([sys.executable, "-c", _ONE_CPU], cwd=ROOT, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stderr[-5000:]
    before, pinned, seen, after, native = json.loads(done.stdout.splitlines()[-1])
    assert pinned == [[before[0]]] * 3
    assert seen == [before] * 2 and after == before
    assert native and all(cpus == before for cpus in native), native


def test_rendezvous_ports_come_from_below_the_ephemeral_range() -> None:
    """Ports for a store to bind later are free and outside the range outgoing connections draw from (a port from
    there may be taken by a connection before the store binds it: EADDRINUSE)."""
    import socket

    start = int(EPHEMERAL_PORTS.read_text().split()[0]) if EPHEMERAL_PORTS.exists() else 32768
    for _ in range(20):
        port = _free_port()
        assert port < start, (port, start)
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))
