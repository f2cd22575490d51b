"""The test pool: real ranks reused across cases, each case on a communicator of its own, failures named."""

from __future__ import annotations

import functools
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from compcoll.launcher import BACKENDS, WorkerFailure
from tests import pool
from tests.leftovers import topology_files

POOLING = [pytest.param(backend, marks=pytest.mark.skipif(
    not pool.pools(backend), reason="Gloo's cases are not pooled before torch 2.8 (tests/versions.py)"))
    for backend in BACKENDS]
"""The backends whose cases the pool runs, each a test parameter (Gloo's skipped where it does not pool them)."""

WORKERS = "tests.pool_workers"
ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def own_pools(monkeypatch: pytest.MonkeyPatch) -> None:
    """Pools of 2 ranks for this test alone: the suite's shared pools, which these tests would end on purpose,
    stay as they are for the other tests."""
    mine: dict[str, pool.Pool] = {}
    monkeypatch.setattr(pool, "_POOLS", mine)
    monkeypatch.setattr(pool, "POOL_RANKS", 2)
    yield
    while mine:
        mine.popitem()[1].close()


@pytest.mark.parametrize("backend", POOLING)
@pytest.mark.usefixtures("own_pools")
def test_cases_of_every_size_reuse_the_ranks_and_a_failure_names_its_rank(backend: str) -> None:
    """Cases of 2, 1 and 2 ranks run on the same processes (a pool of 2), each on a world of its own size; a case
    that fails on one rank names the case and that rank, and the next case runs on new processes."""
    pids = None
    for size in (2, 1, 2):
        out = pool.run(f"{WORKERS}:says_its_rank", size, backend)
        assert [line for line in out.splitlines() if line] == [f"rank {r} of {size}" for r in range(size)]
        started = [p.pid for p in pool._pool(backend, size).procs]
        assert pids is None or started == pids
        pids = started
    with pytest.raises(WorkerFailure) as failure:
        pool.run(f"{WORKERS}:fails_on", 2, backend, args=(1,))
    message = str(failure.value)
    assert f"{WORKERS}:fails_on on 2 {backend} rank(s) (pooled" in message and "rank(s) [1] failed" in message
    assert "case failed on rank 1 on purpose" in message and "[rank 0] FAILED" not in message
    pool.run(f"{WORKERS}:says_its_rank", 2, backend)
    assert not set(p.pid for p in pool._pool(backend, 2).procs) & set(pids)


@pytest.mark.parametrize("backend", POOLING)
@pytest.mark.usefixtures("own_pools")
def test_a_case_that_ends_a_rank_ends_its_pool_and_the_next_case_gets_new_ranks(backend: str) -> None:
    """On pools of 2 ranks, the cases' size. The failure names rank 1's process as ended; under MPI it may name rank
    0's too, where Hydra ended it before it answered (a fresh clone's README run saw "[0, 1] ended"). The pool
    names ranks before its own processes: CI's run on 3abbf35 saw mpiexec's end first, "process(es) [0] ended"."""
    with pytest.raises(WorkerFailure, match=r"process\(es\) \[(0, )?1\] ended"):
        pool.run(f"{WORKERS}:ends_a_rank", 2, backend, timeout=60)
    out = pool.run(f"{WORKERS}:says_its_rank", 2, backend)
    assert "rank 1 of 2" in out


@pytest.mark.parametrize("backend", POOLING)
@pytest.mark.usefixtures("own_pools")
def test_a_case_that_breaks_a_communicator_ends_its_pool(backend: str) -> None:
    """A broken communicator lives as long as its process (``comm.base.BROKEN``). A Gloo one keeps its sockets and
    event loop, which spun on a core for the rest of a run once a peer had closed its end (a run took 22.6 min where
    it takes 10.5); an MPI one leaves messages unmatched, which a later communicator given its context id would
    match. So after a case that breaks one, the pool ends and the next case gets new ranks; a case that says so
    (``breaks``) runs on ranks of its own."""
    pool.run(f"{WORKERS}:says_its_rank", 2, backend)
    pids = {p.pid for p in pool._pool(backend, 2).procs}
    assert pool.run(f"{WORKERS}:breaks_its_communicator", 2, backend).split() == ["timed", "out"]
    assert "rank 1 of 2" in pool.run(f"{WORKERS}:says_its_rank", 2, backend)
    kept = pids & {p.pid for p in pool._pool(backend, 2).procs}
    assert not kept, (backend, pids, kept)
    live = pool._pool(backend, 2)
    assert "timed out" in pool.run(f"{WORKERS}:breaks_its_communicator", 2, backend, breaks=True)
    assert pool._POOLS[backend] is live and live.alive, backend  # the case ran on ranks of its own


@pytest.mark.parametrize("backend", POOLING)
@pytest.mark.usefixtures("own_pools")
def test_a_pool_that_spins_while_idle_ends_naming_the_thread(backend: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A pool idles below ``IDLE_CPU_LIMIT`` (over 1 s here); one whose rank 0 leaves a thread spinning after its
    case is ended by the next look, which names that rank and thread (not its main thread), and the next case gets
    new ranks."""
    monkeypatch.setattr(pool, "IDLE_WINDOW_S", 1.0)
    monkeypatch.setattr(pool, "SPUN", [])
    pool.run(f"{WORKERS}:says_its_rank", 2, backend)
    for _ in range(2):
        pool.watch_idle()
        time.sleep(1.1)
    pool.watch_idle()
    assert backend in pool._POOLS and not pool.SPUN, pool.SPUN
    pool.run(f"{WORKERS}:spins_after_the_case", 2, backend)
    pool.watch_idle()
    time.sleep(1.1)
    pool.watch_idle()
    assert backend not in pool._POOLS and len(pool.SPUN) == 1, pool.SPUN
    assert f"{backend} pool of 2 ranks ended" in pool.SPUN[0] and "rank 0 (pid" in pool.SPUN[0], pool.SPUN
    named = re.search(r"rank 0 \(pid (\d+): .*thread '[^']+' \(tid (\d+): (0\.[5-9]|1\.)", pool.SPUN[0])
    assert named and named[1] != named[2], pool.SPUN
    assert "rank 1 of 2" in pool.run(f"{WORKERS}:says_its_rank", 2, backend)


@pytest.mark.parametrize("backend", POOLING)
@pytest.mark.usefixtures("own_pools")
def test_a_rank_that_fails_while_the_others_wait_ends_the_case_after_the_grace(
        backend: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """As a failed rank ends an MPI job: once rank 1 has failed, the others, waiting in a barrier it never joins,
    have ``FAILED_GRACE_S`` (1 s here) to answer, then the pool ends and the case names both, well within its
    timeout; under MPI, mpiexec is asked to end before it is killed, and removes its topology file."""
    monkeypatch.setattr(pool, "FAILED_GRACE_S", 1.0)
    before = topology_files()
    with pytest.raises(WorkerFailure) as failure:
        pool.run(f"{WORKERS}:fails_while_the_others_wait", 2, backend, args=(1,), timeout=120)
    assert topology_files() <= before
    message = str(failure.value)
    assert "rank(s) [1] failed; rank(s) [0] still running 1 s after rank 1 failed" in message, message
    assert "rank 1 fails on purpose before the barrier" in message, message
    assert re.search(r"File \"[^\"]*pool_workers.py\", line \d+ in fails_while_the_others_wait", message), message
    assert backend not in pool._POOLS  # closed, and dropped at once: its killed ranks may not have died yet
    assert "rank 1 of 2" in pool.run(f"{WORKERS}:says_its_rank", 2, backend)


def test_a_rank_process_that_ended_is_seen_before_its_parent_reaps_it() -> None:
    """The pool watches each rank's own process: one that has ended counts as ended while it is a zombie (its
    parent, under MPI the launcher's proxy, has not reaped it yet), and once it is gone."""
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    deadline = time.monotonic() + 60
    while pool._running(child.pid) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert Path(f"/proc/{child.pid}").exists() and not pool._running(child.pid)
    child.wait()
    assert not pool._running(child.pid) and pool._running(os.getpid())


@pytest.mark.parametrize("backend", POOLING)
def test_a_case_environment_applies_to_that_case_alone(backend: str) -> None:
    env = {"COMPCOLL_TIMEOUT": "7", "COMPCOLL_RANKS_PER_NODE": "1"}
    assert pool.run(f"{WORKERS}:says_its_timeout", 2, backend, env=env).count("timeout 7 ranks per node 1") == 2
    assert "ranks per node None" in pool.run(f"{WORKERS}:says_its_timeout", 2, backend)
    assert "timeout 7" not in pool.run(f"{WORKERS}:says_its_timeout", 2, backend)


_KILLED_OWNER = """
import os
from tests import pool
pool.POOL_RANKS = 2
for backend in {backends!r}:
    pool.run("tests.pool_workers:says_its_rank", 2, backend)
    print(backend, pool._POOLS[backend].folder, *(p.pid for p in pool._POOLS[backend].procs), flush=True)
os._exit(0)
"""


@functools.lru_cache(maxsize=None)
def _killed_owner() -> dict[str, list[str]]:
    """One test process that starts a pool of each backend and exits without its atexit: each pool's folder and
    processes, by backend."""
    backends = [backend for backend in BACKENDS if pool.pools(backend)]
    done = subprocess.run([sys.executable, "-c", _KILLED_OWNER.format(backends=backends)], cwd=ROOT,
                          capture_output=True, text=True, timeout=120, check=True)
    return {backend: rest for backend, *rest in (line.split() for line in done.stdout.splitlines())}


@pytest.mark.parametrize("backend", POOLING)
def test_the_ranks_end_when_the_test_process_ends_without_closing_its_pool(backend: str) -> None:
    """A test process that dies (killed, or exiting without its atexit) leaves no pool ranks running, and no
    pool folder."""
    folder, *pids = _killed_owner()[backend]
    pids = [int(pid) for pid in pids]  # mpiexec (which ends with its ranks), or the Gloo ranks
    assert pids, _killed_owner()
    deadline = time.monotonic() + 60
    while any(Path(f"/proc/{pid}").exists() for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not [pid for pid in pids if Path(f"/proc/{pid}").exists()], "pool ranks outlived their test process"
    assert not Path(folder).exists(), folder
