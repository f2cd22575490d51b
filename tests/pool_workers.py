"""Rank side of the test pool (``tests/pool.py``): real ranks that run one test body after another."""

from __future__ import annotations

import contextlib
import gc
import importlib
import io
import json
import os
import select
import shutil
import threading
import time
import traceback
from pathlib import Path

import compcoll
from compcoll.comm.base import BROKEN

WAKE_S = 1.0
"""How often an idle rank, asleep on its wake-up pipe, looks whether the test process has ended."""


def serve(comm: compcoll.Communicator, directory: str, owner: int) -> None:
    """Run the cases the test process (pid ``owner``) writes into ``directory`` until it writes ``stop`` or ends.

    1. Write this rank's process id into ``pid.<rank>`` (the test process watches it), and wait for
       ``<k>.case`` (JSON: target, size n, args, environment), case k = 0, 1, ..., asleep on this
       rank's pipe ``wake.<rank>``, into which the test process writes a byte after each case it writes
       (``_wait_for``).
    2. Set the case's environment variables (restored after it), and make the case's
       communicator of the first n ranks (``_fresh``); a rank beyond them goes on to case
       k + 1.
    3. Run ``target(fresh, *args)`` on that communicator, made the default, with this
       rank's standard output captured.
    4. Make the launch's communicator the default again, collect the case's garbage, release the
       case's communicator if the case passed (after a failure the test process ends the pool; ``_release``
       says why the garbage goes first), collect again (``_collect``), write ``<k>.<rank>.result`` (JSON:
       the traceback or None, the output, and whether the pool should retire: the case broke a
       communicator), and go on to case k + 1.
       A broken communicator is kept for the life of the process (``comm.base.BROKEN``), and a Gloo one keeps its
       sockets and event loop: once a peer closed its end, that loop could spin on a core for the rest of the
       session (a whole run took 22.6 min, 19.5 of them system CPU, where it takes 10.5: one thread had spun since
       a ``stalled_rank`` case, 2026-12-01). An MPI one leaves its peers' messages unmatched: a rank that never
       joined the call keeps them queued under the communicator's context id, and once that rank has freed the
       communicator, a later one given the same id matches them (a 4-rank digest after ``late_alltoall`` gave other
       bits each run, 2026-12-02).
    5. If the test process ended without stopping the pool, rank 0 removes the folder, which that process
       would have removed.
    """
    base = Path(directory)
    staged = base / f"pid.{comm.rank}.tmp"
    staged.write_text(str(os.getpid()))
    staged.rename(base / f"pid.{comm.rank}")
    store = _leave_launch_group(comm)
    wake = _open_wake_pipe(base / f"wake.{comm.rank}")
    case = 0
    while _wait_for(base / f"{case}.case", base / "stop", owner, wake):
        request = json.loads((base / f"{case}.case").read_text())
        module_name, func_name = request["target"].split(":")
        saved = {key: os.environ.get(key) for key in request["env"]}
        os.environ.update(request["env"])
        fresh = _fresh(comm, request["size"], store, case)
        error, output, broken = None, io.StringIO(), len(BROKEN)
        if fresh is not None:
            compcoll.set_default(fresh)
            try:
                with contextlib.redirect_stdout(output):
                    getattr(importlib.import_module(module_name), func_name)(fresh, *request["args"])
            except BaseException:  # noqa: BLE001 - every failure goes back to the test, which raises it
                error = traceback.format_exc()
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        if fresh is not None:
            compcoll.set_default(comm)  # the launch's, as before the first case
            gc.collect()  # the case's garbage, while torch.distributed still holds its groups (``_release``)
            if error is None:
                _release(fresh)
            fresh = None
            _collect()
            written = base / f"{case}.{comm.rank}.tmp"
            written.write_text(json.dumps({"error": error, "output": output.getvalue(),
                                           "retire": len(BROKEN) > broken}))
            written.rename(base / f"{case}.{comm.rank}.result")
        case += 1
    if comm.rank == 0 and not (base / "stop").exists():
        shutil.rmtree(base, ignore_errors=True)


def _open_wake_pipe(path: Path) -> int:
    """This rank's end of its wake-up pipe (a FIFO the test process made), non-blocking; the rank also holds a
    write end, so that the pipe never reads as closed while no test process has it open."""
    read_end = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    os.open(path, os.O_WRONLY | os.O_NONBLOCK)
    return read_end


def _wait_for(request: Path, stop: Path, owner: int, wake: int) -> bool:
    """Whether ``request`` appeared (True), or ``stop`` did or process ``owner`` ended (False: a test process
    killed before it could stop its pool leaves no ranks behind).

    Between looks the rank sleeps on its pipe ``wake`` until a byte comes (the test process writes one after
    each case and at the stop) or ``WAKE_S`` passes: an idle rank takes no CPU, so the pools do not wake up
    hundreds of times a second to preempt the tests run meanwhile in the test process (a 2-thread in-process
    case took 18.0 s instead of 12.7 s beside polling pools).
    """
    while not request.exists():
        if stop.exists() or not Path(f"/proc/{owner}").exists():
            return False
        select.select([wake], [], [], WAKE_S)
        try:
            while os.read(wake, 4096):
                pass
        except BlockingIOError:
            pass
    return True


def _leave_launch_group(comm: compcoll.Communicator):
    """On Gloo ranks: destroy the process group the ranks were launched with, keeping its store for the cases'
    groups (returned); None on MPI ranks."""
    if hasattr(comm, "mpi_comm"):  # MPIComm (an isinstance check would import mpi4py on Gloo ranks)
        return None
    import torch.distributed as dist

    store = dist.distributed_c10d._get_default_store()
    comm.barrier()
    dist.destroy_process_group()
    return store


def _fresh(comm: compcoll.Communicator, size: int, store, case: int) -> compcoll.Communicator | None:
    """The communicator of case ``case`` over ``comm``'s first ``size`` ranks, as a fresh launch of ``size``
    ranks would make it; None on the ranks beyond them.

    MPI: every rank splits ``comm``, and the split is the job (``job_rank``, ``job_size``, which a fresh launch
    reads from ``COMM_WORLD``). Gloo: those ranks start the default process group of ``size`` ranks (what
    DDP and compcoll's states use when given no group) on the launch's store, under the case's prefix, and pass a
    barrier on it: a rank's ``init_process_group`` can return while a peer is still connecting to it, and a case
    that sends nothing would then destroy the group under that peer ("Connection closed by peer").
    """
    member = comm.rank < size
    if store is None:
        from mpi4py import MPI

        split = comm.mpi_comm.Split(0 if member else MPI.UNDEFINED, comm.rank)
        if not member:
            return None
        fresh = compcoll.MPIComm(split)
        fresh.job_rank, fresh.job_size = fresh.rank, fresh.size
        return fresh
    if not member:
        return None
    import torch.distributed as dist

    dist.init_process_group("gloo", store=dist.PrefixStore(f"case-{case}", store), rank=comm.rank, world_size=size)
    dist.barrier()
    return compcoll.TorchComm()


def _release(comm: compcoll.Communicator) -> None:
    """Free a case's communicator (MPI context ids and Gloo sockets are finite), once the operations it still holds
    (handles the case dropped unwaited, ``Communicator._track``) have completed: MPI writes into an operation's
    buffers until it completes, and freed with its communicator the buffers would be reused meanwhile (the heap
    corruption an MPI pool rank died of, after ``comm_workers.fire_and_forget``). A broken communicator's are kept
    for the life of the process instead (``comm.base.BROKEN``).

    The case's garbage must be collected before (``serve``, step 4). A DDP model left in a reference cycle (a
    caught exception's traceback holds the case's frame) is freed by the garbage collector, and torch frees its
    ``Reducer`` holding the GIL (pytorch/pytorch#56297). Once ``destroy_process_group`` has let go of the groups,
    the Reducer holds the last reference to DDP's, so ``~ProcessGroupGloo`` then joins the group's worker threads
    with the GIL held. A worker that has just finished a collective (``assert_replicas_equal``'s all-gather) drops
    the work's tensors under the group's work lock, and waits for the GIL to release their Python objects; the
    other worker waits for that lock, and the join never ends. gdb showed exactly this on the rank that hung in
    ``gc.collect()`` (``onebit_resumes_on_another_world_size`` on 4 ranks: 4 hangs in 32 runs of its test,
    2026-12-02). While torch.distributed holds every group, no group ends inside the collector: it ends here,
    when its Python object goes, whose destructor drops the GIL."""
    if comm._broken is None:
        for work in list(comm._in_flight):
            work.wait()
    if hasattr(comm, "mpi_comm"):
        comm.mpi_comm.Free()
    else:
        import torch.distributed as dist

        dist.destroy_process_group()


def _collect() -> None:
    """Collect the garbage a case left, once nothing refers to its communicator: a Gloo group's threads (two workers
    and an event loop, which wakes on its own) end only with the last reference to it. What survives (modules,
    caches: what the process keeps) is then frozen (``gc.freeze``), so that the next collection looks only at what
    was made since: a full collection over everything torch and Numba keep took 135-150 ms of CPU, on every rank
    after every case.

    The cost: what is frozen while something still holds it, and is let go later inside a reference cycle, is never
    collected. Until 2026-12-02 compcoll's optimizers (``optim/flat._built_by_zero``) kept a copy of this loop's
    locals, so each case's communicator (held in a cycle with its topology's splits) was frozen, then let go at the
    next optimizer: rank 0 of the Gloo pool ended a whole run with 60 event loops, 11 after the fix (2 from the
    start, 7 added by the FSDP2 cases, whose torch ``fully_shard`` keeps a group, one each by a Trainer case and the
    ZeroRedundancyOptimizer case). And an ordering thread still held a case's last call for an instant after it
    woke the case (``comm/ordering``), now and then long enough to be frozen."""
    gc.collect()
    gc.freeze()


def says_its_rank(comm: compcoll.Communicator) -> None:
    """Prints this rank and the size of its communicator, which on Gloo is the default process group
    (``tests/test_pool.py``)."""
    comm.barrier()
    if not hasattr(comm, "mpi_comm"):
        import torch.distributed as dist

        assert comm.group is dist.group.WORLD and dist.get_world_size() == comm.size, dist.get_world_size()
    print(f"rank {comm.rank} of {comm.size}")


def fails_on(comm: compcoll.Communicator, rank: int) -> None:
    """Raises on ``rank`` only (``tests/test_pool.py``)."""
    if comm.rank == rank:
        raise RuntimeError(f"case failed on rank {rank} on purpose")


def fails_while_the_others_wait(comm: compcoll.Communicator, rank: int) -> None:
    """Raises on ``rank``; the other ranks wait in a barrier that rank never joins (``tests/test_pool.py``)."""
    if comm.rank == rank:
        raise RuntimeError(f"rank {rank} fails on purpose before the barrier")
    comm.barrier()


def ends_a_rank(comm: compcoll.Communicator) -> None:
    """The last rank's process ends (``tests/test_pool.py``)."""
    if comm.rank == comm.size - 1:
        os._exit(3)


def breaks_its_communicator(comm: compcoll.Communicator) -> None:
    """Rank 0's barrier times out, which breaks its communicator, and it prints so; rank 1 comes after that timeout
    and leaves without the barrier (``tests/test_pool.py``)."""
    if comm.rank == 0:
        comm.timeout = 0.5
        try:
            comm.barrier()
        except compcoll.CollectiveTimeout:
            print("timed out")
        return
    time.sleep(2.0)


def spins_after_the_case(comm: compcoll.Communicator) -> None:
    """Rank 0 leaves a thread spinning after the case returns (``tests/test_pool.py``)."""
    if comm.rank == 0:
        threading.Thread(target=_spin, daemon=True).start()


def _spin() -> None:
    while True:
        pass


def says_its_timeout(comm: compcoll.Communicator) -> None:
    """Prints the communicator's timeout and ``COMPCOLL_RANKS_PER_NODE`` (``tests/test_pool.py``)."""
    print(f"timeout {comm.timeout:g} ranks per node {os.environ.get('COMPCOLL_RANKS_PER_NODE')}")
