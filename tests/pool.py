"""Real MPI and Gloo ranks started once per backend and reused by every test body (mpi4py's way: one launch).

``run`` has ``compcoll.launcher.run``'s signature. A body on "mpi" or "gloo" ranks with no
per-rank placement, and no environment beyond ``CASE_ENV``, goes to the pool of real ranks of that backend,
started at its first case (``POOL_RANKS`` ranks, or more if the case needs them) and kept for the next ones
(``tests/pool_workers.serve``): each case of n ranks gets a communicator of its own over the pool's first n
ranks, and the others wait for the next case. A thread world runs with ``one_cpu=True``
(``launcher.run_threads``: the bodies hand over far more than they compute). Every other call (NCCL,
namespaces, environment variables) starts its own ranks, as before. A case that fails
raises ``WorkerFailure`` naming the case, the backend, the size and each failed rank with
its traceback. A case that fails, times out, or ends a rank, ends its pool too; the next case
starts a new one. So does a case that breaks a communicator (``pool_workers.serve``, step 4): a case that
does so on purpose (a timeout) says ``breaks=True`` and starts ranks of its own instead, so that the pool's
ranks live on. Before each test (``tests/conftest.py``), ``watch_idle`` ends a pool whose processes take a core's
share while no case runs (a thread that spins) and notes what spun, for the session's summary.
``COMPCOLL_TEST_POOL=0`` starts fresh ranks for every case, as Gloo's cases do before torch 2.8
(``versions.GLOO_POOLS``).
"""

from __future__ import annotations

import atexit
import json
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

from compcoll import launcher, processes
from compcoll.launcher import WorkerFailure
from tests.versions import GLOO_POOLS

POOLED_BACKENDS = ("mpi", "gloo")
POOL_RANKS = 6
"""Ranks a pool starts with: the most any pooled case takes; a case that wants more replaces its backend's pool."""
FAILED_GRACE_S = 5.0
"""Seconds the other ranks of a case have to answer once one rank has failed; then the pool is ended, as a failed
rank ends an MPI job (a pool rank reports its failure and lives on, and its peers would wait out the case's timeout
in their next collective)."""
STOP_WAIT_S = 10.0
"""Seconds idle ranks have to stop when their pool closes, before they are killed."""
POOL_ENV = "COMPCOLL_TEST_POOL"
IDLE_CPU_LIMIT = 0.2
"""Share of a core a pool's processes may take together while no case runs (6 idle Gloo ranks: 0.02-0.05; one run
of the suite had a pool take 0.4 from a case 88 tests before its end to the end)."""
IDLE_WINDOW_S = 2.0
"""Seconds of idling ``watch_idle`` measures a pool over, at the least."""
SPUN: list[str] = []
"""What ``watch_idle`` found spinning, a line for each pool it ended (the session's summary prints them)."""
CASE_ENV = ("COMPCOLL_TIMEOUT", "COMPCOLL_RANKS_PER_NODE")
"""Environment variables a pooled case may set: compcoll reads them when a communicator is made or a call starts,
not when a process starts, so the ranks set them for that case alone."""


class Pool:
    """``size`` real ranks of ``backend`` running ``tests.pool_workers.serve`` over a folder of cases."""

    def __init__(self, backend: str, size: int) -> None:
        self.backend, self.size, self.cases = backend, size, 0
        self.pids: dict[int, int] = {}
        self.closed = False
        self.idle: tuple[float, dict[tuple[int, int], tuple[str, float]]] | None = None
        self.folder = Path(tempfile.mkdtemp(prefix=f"compcoll-pool-{backend}{size}-"))
        for rank in range(size):
            os.mkfifo(self.folder / f"wake.{rank}")
        launches = launcher.rank_commands("tests.pool_workers:serve", size, backend,
                                          args=(str(self.folder), os.getpid()))
        self.logs = [tempfile.TemporaryFile(mode="w+") for _ in launches]
        self.procs = [subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT, text=True,
                                       start_new_session=True) for (command, env), log in zip(launches, self.logs)]

    def run(self, target: str, size: int, args: tuple, timeout: float, env: dict[str, str] | None = None) -> str:
        """Run one case on the first ``size`` ranks; returns their captured output, rank by rank.

        1. Write case k (written whole, then renamed, so no rank reads half of it), and wake the ranks.
        2. Wait for each of the ``size`` ranks' results, up to ``timeout``, or ``FAILED_GRACE_S``
           once a rank has failed; a rank process that ends first, or the timeout, closes the
           pool and raises ``WorkerFailure`` with the ranks' log.
        3. Raise ``WorkerFailure`` with each failed rank's traceback, and the ranks still running
           past the grace (closing the pool: a failed case may leave operations pending), or
           return the output, closing the pool first where a rank says it should retire.
        """
        case, self.cases, self.idle = self.cases, self.cases + 1, None
        staged = self.folder / f"{case}.tmp"
        staged.write_text(json.dumps({"target": target, "size": size, "args": json.loads(json.dumps(list(args))),
                                      "env": env or {}}))
        staged.rename(self.folder / f"{case}.case")
        self._wake()
        where = f"{target} on {size} {self.backend} rank(s) (pooled, case {case})"
        deadline, pause, first_failed = time.monotonic() + timeout, 0.001, None
        results: dict[int, dict] = {}
        while len(results) < size:
            for r in range(size):
                path = self.folder / f"{case}.{r}.result"
                if r not in results and path.exists():
                    results[r] = json.loads(path.read_text())
                    if results[r]["error"] and first_failed is None:
                        first_failed, deadline = r, min(deadline, time.monotonic() + FAILED_GRACE_S)
            if len(results) == size:
                break
            ended, late = self._ended(), time.monotonic() > deadline
            if late and not ended and first_failed is not None:
                break
            if ended or late:
                note = ended or f"timed out after {timeout:g} s"
                self._print_stacks(size, results)
                text = self.close(wait=0.0)
                raise WorkerFailure(f"{where}: {note}; ranks {sorted(results)} had answered (the others printed their "
                                    f"threads' stacks)\n{text[-20000:]}")
            time.sleep(pause)
            pause = min(2 * pause, 0.02)
        failed = {r: res["error"] for r, res in sorted(results.items()) if res["error"]}
        if failed:
            absent = sorted(set(range(size)) - set(results))
            self._print_stacks(size, results)
            text = self.close(wait=0.0 if absent else STOP_WAIT_S)
            still = (f"; rank(s) {absent} still running {FAILED_GRACE_S:g} s after rank {first_failed} failed: the "
                     f"pool was ended, as a failed rank ends an MPI job; their stacks are at the end") if absent else ""
            details = "\n".join(f"[rank {r}] FAILED:\n{error}" for r, error in failed.items())
            stacks = f"\n{text[-10000:]}" if absent else ""
            raise WorkerFailure(f"{where}: rank(s) {sorted(failed)} failed{still}\n{details[-20000:]}{stacks}")
        if any(result.get("retire") for result in results.values()):
            self.close()
        return "\n".join(results[r]["output"] for r in range(size))

    def _print_stacks(self, size: int, results: dict[int, dict]) -> None:
        """Have the case's ranks that have not answered print their threads' stacks to the pool's log
        (``processes.print_stacks``)."""
        self._ended()  # reads the process ids of ranks that started since the last look
        processes.print_stacks(pid for rank, pid in self.pids.items() if rank < size and rank not in results)

    def _wake(self) -> None:
        """A byte into each rank's pipe ``wake.<rank>`` (``pool_workers._wait_for``); a rank that has not opened
        its pipe yet (still starting) reads the folder once it has, and a full pipe is awake already."""
        for rank in range(self.size):
            try:
                pipe = os.open(self.folder / f"wake.{rank}", os.O_WRONLY | os.O_NONBLOCK)
            except OSError:  # ENXIO: no reader yet, or the rank has ended
                continue
            try:
                os.write(pipe, b"w")
            except BlockingIOError:
                pass
            finally:
                os.close(pipe)

    def _ended(self) -> str:
        """What has ended, or "": a rank's own process (by rank, from the pid it wrote), else a process the pool
        started (by index). Ranks first: under one mpiexec the pool's one process is the launcher, which ends
        when a rank does (or sees a rank's end late or, rarely, not at all), and its index names no rank."""
        for rank in range(self.size):
            if rank not in self.pids and (self.folder / f"pid.{rank}").exists():
                self.pids[rank] = int((self.folder / f"pid.{rank}").read_text())
        ranks = [rank for rank, pid in sorted(self.pids.items()) if not _running(pid)]
        if ranks:
            return f"rank process(es) {ranks} ended"
        procs = [i for i, p in enumerate(self.procs) if p.poll() is not None]
        return f"process(es) {procs} ended" if procs else ""

    def spinning(self) -> str:
        """What took more than ``IDLE_CPU_LIMIT`` of a core while the pool idled, or "".

        1. With no mark yet (none since the last case began), take one: each thread's CPU time in the pool's
           processes (``_threads``), and the time.
        2. Once ``IDLE_WINDOW_S`` has passed since the mark, take the threads' CPU since it, and mark anew.
        3. Above the limit, name the total, the process that took most (its rank, if a rank's) and how many of its
           threads took any, and its thread that took most, by system name and id (a Python thread's system name
           is its program's).
        """
        now = time.monotonic()
        if self.idle is not None and now - self.idle[0] < IDLE_WINDOW_S:
            return ""
        seen = _threads(p.pid for p in self.procs)
        if self.idle is None:
            self.idle = (now, seen)
            return ""
        (then, before), self.idle = self.idle, (now, seen)
        took = {key: cpu - before.get(key, ("", 0.0))[1] for key, (_, cpu) in seen.items()}
        total = sum(took.values()) / (now - then)
        if total <= IDLE_CPU_LIMIT:
            return ""
        span, processes = now - then, {}
        for (pid, _), cpu in took.items():
            processes[pid] = processes.get(pid, 0.0) + cpu
        pid = max(processes, key=processes.get)
        busy = {tid: cpu for (process, tid), cpu in took.items() if process == pid and cpu > 0}
        tid = max(busy, key=busy.get)
        self._ended()
        rank = {process: r for r, process in self.pids.items()}.get(pid)
        owner = f"rank {rank}" if rank is not None else "a launcher process"
        return (f"{total:.2f} of a core over {span:.1f} s with no case running, most in {owner} (pid {pid}: "
                f"{processes[pid] / span:.2f}, in {len(busy)} thread(s)), most in thread {seen[(pid, tid)][0]!r} "
                f"(tid {tid}: {busy[tid] / span:.2f})")

    @property
    def alive(self) -> bool:
        return not self.closed and not self._ended()

    def close(self, wait: float = STOP_WAIT_S) -> str:
        """Stop the ranks (killed if they do not stop within ``wait`` seconds: 0 where some are stuck in a
        collective, which no stop reaches), and reap them; returns their log. The pool is closed from then on."""
        if self.closed:
            return ""
        self.closed = True
        (self.folder / "stop").touch()
        self._wake()
        deadline = time.monotonic() + wait
        for p in self.procs:
            try:
                p.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                break
        processes.end_processes(self.procs)
        for p in self.procs:
            p.wait()
        text = []
        for log in self.logs:
            log.seek(0)
            text.append(log.read())
            log.close()
        shutil.rmtree(self.folder, ignore_errors=True)
        return "\n".join(text)


def _running(pid: int) -> bool:
    """Whether process ``pid`` runs: it exists and is not a zombie (ended, not yet reaped by its parent)."""
    stat = processes.proc_stat(f"/proc/{pid}/stat")
    return stat is not None and stat[1][0] not in ("Z", "X")


def _threads(roots) -> dict[tuple[int, int], tuple[str, float]]:
    """The name and CPU seconds (user and system) of each thread, keyed (pid, tid), of processes ``roots`` and their
    descendants (under MPI: Hydra's proxies, then the ranks)."""
    found = {}
    tick = os.sysconf("SC_CLK_TCK")
    for pid in processes.descendants(roots):
        try:
            tids = os.listdir(f"/proc/{pid}/task")
        except OSError:
            continue
        for tid in tids:
            stat = processes.proc_stat(f"/proc/{pid}/task/{tid}/stat")
            if stat is not None:
                name, fields = stat
                found[(pid, int(tid))] = (name, (int(fields[11]) + int(fields[12])) / tick)
    return found


_POOLS: dict[str, Pool] = {}


def _pool(backend: str, size: int) -> Pool:
    """The live pool of ``backend`` with at least ``size`` ranks: started if there is none, replaced if it has
    fewer ranks or one of its processes has ended."""
    pool = _POOLS.get(backend)
    if pool is not None and (not pool.alive or pool.size < size):
        _POOLS.pop(backend).close()
        pool = None
    if pool is None:
        pool = _POOLS[backend] = Pool(backend, max(size, POOL_RANKS))
    return pool


@atexit.register
def close_all() -> None:
    """Close every pool (at the end of the test session)."""
    while _POOLS:
        _POOLS.popitem()[1].close()


def watch_idle() -> None:
    """End each pool that spins while no case runs (``Pool.spinning``), noting what spun in ``SPUN``; the next case
    of its backend starts a new one."""
    for backend, pool in list(_POOLS.items()):
        spun = pool.spinning()
        if spun:
            SPUN.append(f"{backend} pool of {pool.size} ranks ended: {spun}")
            _POOLS.pop(backend).close(wait=0.0)


def pools(backend: str) -> bool:
    """Whether ``backend``'s cases go to a pool: MPI's, and Gloo's from torch 2.8 (``versions.GLOO_POOLS``)."""
    return backend in POOLED_BACKENDS and (backend != "gloo" or GLOO_POOLS)


def run(target: str, world_size: int, backend: str = "mpi", *, args: tuple = (), timeout: float = 180.0,
        env: dict[str, str] | None = None, breaks: bool = False, **placement) -> str:
    """``compcoll.launcher.run``, on a pool's ranks where the case allows (see the module's docstring).

    ``breaks``: the case breaks its communicator on purpose (a timeout). It then starts ranks of its own, since the
    pool would end after it and start all its ranks again for the next case of its backend (on Gloo 5 cases did: 6
    starts of 6 ranks where 1 does, about 14 CPU-s each).
    """
    if backend == "threads":
        return launcher.run_threads(target, world_size, args=args, timeout=timeout, env=env, one_cpu=True)
    pooled = (pools(backend) and set(env or {}) <= set(CASE_ENV) and not any(placement.values())
              and os.environ.get(POOL_ENV, "1") != "0" and not breaks)
    if not pooled:
        return launcher.run(target, world_size, backend, args=args, timeout=timeout, env=env, **placement)
    pool = _pool(backend, world_size)
    try:
        return pool.run(target, world_size, args, timeout, env)
    finally:
        if not pool.alive:
            _POOLS.pop(backend, None)
