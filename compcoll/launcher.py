"""Run a function on N local processes (mpiexec, or torchrun-style Gloo) or threads, with a timeout.

Used by the benchmark's ``--launch``, the network suite and the tests. The parent starts
the ranks, each rank runs ``function(comm, *args)`` on the communicator ``compcoll.init``
builds and reports through its exit code; the parent raises ``WorkerFailure`` with their
output if any rank fails or the whole run exceeds its timeout (the rank processes still
running first print every thread's stack into that output: ``processes.print_stacks``).
"""

from __future__ import annotations

import argparse
import contextlib
import faulthandler
import functools
import importlib
import json
import os
import random
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from pathlib import Path
from typing import IO, Callable, Iterator, Sequence

from .comm import TORCH_BACKEND_ENV, Communicator, LocalComm, local_world
from .processes import STACKS_SIGNAL, descendants, end_processes, print_stacks

BACKENDS = ("mpi", "gloo")
ALL_BACKENDS = (*BACKENDS, "nccl", "threads")


_SEEDING = threading.Lock()


class WorkerFailure(RuntimeError):
    """A multi-process run failed or timed out; the message holds the ranks' output."""


@contextlib.contextmanager
def seeded(seed: int) -> Iterator[None]:
    """Draw from torch's global generator seeded with ``seed``, one thread at a time, and restore it after.

    For code that seeds the global generator (``torch.manual_seed``, then building a model)
    and may run on thread ranks (``backend="threads"``), where every rank shares that
    generator: ``with seeded(0): model = Net()`` gives each thread the draws a real rank
    gets, where interleaved draws would silently differ. On its own process it is
    ``torch.manual_seed`` undone at exit.
    """
    import torch

    with _SEEDING, torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        yield


def mpiexec() -> str:
    """The ``mpiexec`` beside ``sys.executable`` (the mpich wheel's), else the one on PATH."""
    beside = Path(sys.executable).parent / "mpiexec"
    found = str(beside) if beside.exists() else shutil.which("mpiexec")
    if not found:
        raise FileNotFoundError("no mpiexec found: pip install 'compcoll[mpi]' (mpi4py and mpich)")
    return found


@functools.lru_cache(maxsize=None)
def is_open_mpi(path: str) -> bool:
    """Whether the ``mpiexec`` at ``path`` is Open MPI's (its ``--version`` names it); otherwise MPICH's Hydra is
    assumed (``-env`` options, oversubscription allowed)."""
    version = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=60)
    return "Open MPI" in version.stdout + version.stderr


def mpiexec_options(env: dict[str, str]) -> list[str]:
    """The options of ``mpiexec()`` that set ``env`` for one segment of ranks: Hydra's ``-env NAME VALUE``, Open
    MPI's ``-x NAME=VALUE``."""
    if is_open_mpi(mpiexec()):
        return [option for name, value in env.items() for option in ("-x", f"{name}={value}")]
    return [option for name, value in env.items() for option in ("-env", name, value)]


def mpiexec_command() -> list[str]:
    """``mpiexec()`` with the options a local launch needs: Open MPI refuses more ranks than cores unless told to
    oversubscribe (MPICH's Hydra allows it), which ``run``'s local ranks often are."""
    path = mpiexec()
    return [path, "--map-by", ":OVERSUBSCRIBE"] if is_open_mpi(path) else [path]


EPHEMERAL_PORTS = Path("/proc/sys/net/ipv4/ip_local_port_range")


def _free_port() -> int:
    """A TCP port that is free now and below the kernel's ephemeral range, for a rendezvous store to bind later.

    A port the kernel hands out for binding port 0 comes from the ephemeral range, which every
    outgoing connection draws from too (Gloo's, the pool's): by the time the store binds it,
    one may hold it (EADDRINUSE). Below that range only explicit binds take ports.
    1. Read the range's start (Linux; 32768 elsewhere).
    2. Try up to 64 random ports in the 12,000 below it; return the first that binds.
    3. If none does, fall back to a port the kernel picks.
    """
    start = int(EPHEMERAL_PORTS.read_text().split()[0]) if EPHEMERAL_PORTS.exists() else 32768
    candidates = range(max(1024, start - 12000), max(1025, start))
    for port in random.SystemRandom().sample(candidates, min(64, len(candidates))):
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _base_env(world_size: int, extra: dict[str, str] | None) -> dict[str, str]:
    env = dict(os.environ)
    paths = [p for p in sys.path if p and Path(p).is_dir()]
    env["PYTHONPATH"] = os.pathsep.join(paths)
    threads = str(max(1, (os.cpu_count() or 1) // world_size))
    env.setdefault("NUMBA_NUM_THREADS", threads)
    env.setdefault("OMP_NUM_THREADS", threads)
    env.update(extra or {})
    return env


def run(
    target: str,
    world_size: int,
    backend: str = "mpi",
    *,
    args: tuple = (),
    timeout: float = 180.0,
    env: dict[str, str] | None = None,
    rank_prefix: Sequence[Sequence[str]] | None = None,
    rank_env: Sequence[dict[str, str]] | None = None,
    master_addr: str = "127.0.0.1",
) -> str:
    """Run ``target`` ("package.module:function") on ``world_size`` local processes.

    1. Start the ranks: ``mpiexec -n N`` for "mpi"; N processes with RANK, WORLD_SIZE,
       MASTER_ADDR/PORT (as torchrun sets them) for "gloo" or "nccl" (that process-group
       backend, through ``COMPCOLL_TORCH_BACKEND``); N threads of this process over one
       in-process world (``compcoll.comm.local_world``) for "threads" (``run_threads``).
    2. Each rank calls ``function(comm, *args)``; ``args`` must be JSON-serialisable.
    3. Wait up to ``timeout`` seconds for all ranks, killing them all past it (or when
       the wait is interrupted: Ctrl-C, SIGTERM turned into SystemExit).

    Ranks can be placed on emulated nodes: ``rank_prefix[r]`` goes in front of rank r's
    command (``ip netns exec ns``) and ``rank_env[r]`` is added to its environment (Gloo:
    ``GLOO_SOCKET_IFNAME``; MPI: what keeps MPICH off shared memory). MPI ranks are then
    started as one mpiexec with a segment per rank (``-n 1 -env ... prefix python ...``);
    for Gloo, ``master_addr`` is rank 0's address.

    Returns the ranks' combined output; raises ``WorkerFailure`` if any rank failed.
    """
    if backend not in ALL_BACKENDS:
        raise ValueError(f"backend must be one of {ALL_BACKENDS}, got {backend!r}")
    if backend == "threads":
        return run_threads(target, world_size, args=args, timeout=timeout, env=env)
    launches = rank_commands(target, world_size, backend, args=args, env=env, rank_prefix=rank_prefix,
                             rank_env=rank_env, master_addr=master_addr)
    logs = [tempfile.TemporaryFile(mode="w+") for _ in launches]
    try:
        procs = [
            subprocess.Popen(cmd, env=e, stdout=log, stderr=subprocess.STDOUT, text=True, start_new_session=True)
            for (cmd, e), log in zip(launches, logs)
        ]
        try:
            failed = _wait_all(procs, timeout)
        except BaseException:
            end_processes(procs)
            raise
        text = "\n".join(_read(log) for log in logs)
    finally:
        for log in logs:
            log.close()
    if failed:
        raise WorkerFailure(f"{target} on {world_size} {backend} rank(s): {failed}\n{text[-20000:]}")
    return text


def rank_commands(
    target: str,
    world_size: int,
    backend: str,
    *,
    args: tuple = (),
    env: dict[str, str] | None = None,
    rank_prefix: Sequence[Sequence[str]] | None = None,
    rank_env: Sequence[dict[str, str]] | None = None,
    master_addr: str = "127.0.0.1",
) -> list[tuple[list[str], dict[str, str]]]:
    """The processes ``run`` starts for real ranks ("mpi", "gloo", "nccl"): (command, environment) pairs, one mpiexec
    for MPI, one process per rank otherwise."""
    command = [sys.executable, "-m", "compcoll.launcher", backend, target, json.dumps(list(args))]
    base = _base_env(world_size, env)
    if backend == "mpi" and (rank_prefix or rank_env):
        segments: list[str] = []
        for r in range(world_size):
            segments += [":"] if r else []
            segments += ["-n", "1", *mpiexec_options(rank_env[r] if rank_env else {})]
            segments += [*(rank_prefix[r] if rank_prefix else ()), *command]
        launches = [([*mpiexec_command(), *segments], base)]
    elif backend == "mpi":
        launches = [([*mpiexec_command(), "-n", str(world_size), *command], base)]
    else:
        port = str(_free_port())
        launches = [
            ([*(rank_prefix[r] if rank_prefix else ()), *command],
             {**base, TORCH_BACKEND_ENV: backend, "RANK": str(r), "WORLD_SIZE": str(world_size),
              "LOCAL_RANK": str(r), "LOCAL_WORLD_SIZE": str(world_size), "MASTER_ADDR": master_addr,
              "MASTER_PORT": port,
              **(rank_env[r] if rank_env else {})})
            for r in range(world_size)
        ]
    return launches


def run_threads(target: str | Callable[..., None], world_size: int, *, args: tuple = (), timeout: float = 180.0,
                env: dict[str, str] | None = None, one_cpu: bool = False) -> str:
    """Run ``target`` ("package.module:function", or the function itself) on ``world_size`` threads of this process,
    each with its rank of one ``local_world``.

    1. Set ``env`` in this process's environment for the run (the ranks share it), and
       restore it after.
    2. Build the world (its collectives time out after ``timeout`` seconds, so a rank that
       never arrives fails the others) and start one daemon thread per rank; ``args`` go
       through JSON, as to real ranks. ``one_cpu=True`` keeps the rank threads (and the
       threads they start) on one CPU, the lowest this thread may use, the CPU kernels'
       worker threads being started first on all of them (``codecs.start_cpu_threads``):
       faster where the ranks mostly hand over to each other (small tensors, many
       collectives: their Python runs one rank at a time anyway, under one GIL, and a
       hand-over within one CPU costs a fraction of one between CPUs), slower where they
       compute in torch between collectives, whose ops otherwise run on every CPU at once
       (docs/architecture.md, "Layers").
    3. A rank whose target raises ends the world (``LocalComm.abort``), as a failed MPI rank
       ends its job: the others' collectives raise at once instead of waiting out ``timeout``.
       A rank whose target returns leaves it (``LocalComm.leave``): a collective that waits
       for it raises ``RankMismatchError`` at once, and so ends the world.
    4. Wait up to ``timeout`` seconds for them all.
    5. Raise ``WorkerFailure`` naming each failed rank with its traceback, or the ranks
       still running past the timeout with where each one is (their threads are left to end
       with the process).
    Threads share this process's global random state (``torch.manual_seed``): a target
    must draw from generators of its own, or build under ``seeded``, to give the bits of
    real ranks.
    """
    if callable(target):
        function = target
    else:
        module_name, func_name = target.split(":")
        function = getattr(importlib.import_module(module_name), func_name)
    arguments = json.loads(json.dumps(list(args)))
    failures: dict[int, str] = {}

    cpus = _rank_cpus() if one_cpu else None
    if cpus:
        from .codecs import start_cpu_threads

        start_cpu_threads()

    def rank(comm: LocalComm) -> None:
        try:
            if cpus:
                os.sched_setaffinity(0, cpus)
            function(comm, *arguments)
            comm.leave()
        except BaseException as exc:
            failures[comm.rank] = traceback.format_exc()
            first_line = "".join(str(exc).splitlines()[:1])
            comm.abort(f"rank {comm.rank} failed: {type(exc).__name__}: {first_line}")

    saved = {key: os.environ.get(key) for key in env or {}}
    os.environ.update(env or {})
    try:
        threads = [threading.Thread(target=rank, args=(comm,), name=f"compcoll-rank-{comm.rank}", daemon=True)
                   for comm in local_world(world_size, timeout)]
        for thread in threads:
            thread.start()
        deadline = time.monotonic() + timeout
        for thread in threads:
            thread.join(max(0.0, deadline - time.monotonic()))
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
    running = [r for r, thread in enumerate(threads) if thread.is_alive()]
    if failures or running:
        notes = [f"rank(s) {running} still running after {timeout:g} s"] if running else []
        frames = sys._current_frames()
        stacks = [f"[rank {r}] still running at:\n{''.join(traceback.format_stack(frames[threads[r].ident]))}"
                  for r in running if threads[r].ident in frames]
        text = "\n".join([f"[rank {r}] FAILED:\n{failures[r]}" for r in sorted(failures)] + stacks)
        what = target if isinstance(target, str) else target.__qualname__
        raise WorkerFailure(f"{what} on {world_size} threads: {'; '.join(notes + [f'{len(failures)} failed'])}"
                            f"\n{text[-20000:]}")
    return ""


def _rank_cpus() -> set[int] | None:
    """The one CPU of an in-process world's rank threads: the lowest the calling thread may run on; None where
    threads have no affinity to set (not Linux) or the caller may run on one CPU only."""
    if not hasattr(os, "sched_setaffinity"):
        return None
    allowed = os.sched_getaffinity(0)
    return {min(allowed)} if len(allowed) > 1 else None


def _read(log: IO[str]) -> str:
    log.seek(0)
    return log.read()


def _wait_all(procs: list[subprocess.Popen], timeout: float) -> str:
    """Wait for every process; past ``timeout`` kill them all. Returns a failure note ("" if none).

    Ranks write to files, not pipes, so a rank with much output never blocks on a pipe
    that the parent is not reading yet.
    """
    deadline = time.monotonic() + timeout
    failures = []
    for i, p in enumerate(procs):
        try:
            p.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            print_stacks(descendants(q.pid for q in procs))
            end_processes(procs)
            p.wait()
            failures.append(f"timed out after {timeout:g} s (each rank still running printed its threads' stacks)")
        if p.returncode:
            failures.append(f"process {i} exited with {p.returncode}")
    return "; ".join(failures)


def _worker(backend: str, target: str, args_json: str) -> int:
    """One rank: build the communicator (on MPI, then release MPICH's segment name: ``comm.segments``), run the
    target, turn the outcome into an exit code."""
    import compcoll

    faulthandler.register(STACKS_SIGNAL, all_threads=True)
    module_name, func_name = target.split(":")
    comm = compcoll.init("mpi" if backend == "mpi" else "torch")
    if backend == "mpi":
        from mpi4py import MPI

        from .comm.segments import release_mpich_segment

        release_mpich_segment(MPI.COMM_WORLD)
    try:
        getattr(importlib.import_module(module_name), func_name)(comm, *json.loads(args_json))
    except BaseException:
        print(f"[rank {comm.rank}] FAILED:\n{traceback.format_exc()}", flush=True)
        sys.stdout.flush()
        os._exit(1)
    _shutdown(comm)
    return 0


def _shutdown(comm: Communicator) -> None:
    """Let every rank finish, close torch.distributed, and leave without C++ static teardown.

    A rank whose communicator broke (a timeout test) skips the barrier; a barrier that
    times out because a peer broke is not an error of the target. Gloo ranks then exit
    with ``os._exit``: after all work is done, exiting through interpreter teardown
    aborted now and then ("terminate called without an active exception") in these
    short-lived ranks.
    """
    import torch.distributed as dist

    from .errors import CompcollError

    sys.stdout.flush()
    if not (dist.is_available() and dist.is_initialized()):
        return
    try:
        comm.barrier()
    except CompcollError:
        pass
    dist.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("backend", choices=ALL_BACKENDS)
    parser.add_argument("target")
    parser.add_argument("args", nargs="?", default="[]")
    ns = parser.parse_args()
    sys.exit(_worker(ns.backend, ns.target, ns.args))
