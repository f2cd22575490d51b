"""Rank-side bodies of the Communicator tests (run by compcoll.launcher)."""

from __future__ import annotations

import gc
import os
import pathlib
import shutil
import signal
import tempfile
import threading
import time
import weakref

import torch
import torch.distributed as dist

import compcoll
import compcoll.checkpoint
from compcoll import processes
from compcoll.comm import groups
from compcoll.comm.torchdist import TorchComm, own_comm
from compcoll.optim import OneBitAdam


def _use_and_drop(comm: compcoll.Communicator) -> weakref.ref:
    """A sub-communicator of all ranks, used blocking and asynchronously and by the hierarchical form (which keeps
    plans and a topology for it), then dropped; a weak reference to it."""
    child = comm.split(0)
    x = torch.arange(1001, dtype=torch.float32) * (comm.rank + 1)
    full = compcoll.padded_numel(x.numel(), child.size)
    we, se = torch.zeros(full), torch.zeros(full // child.size)
    compcoll.compressed_allreduce(x, we, se, child)
    compcoll.compressed_allreduce(x, we, se, child, async_op=True).wait()
    compcoll.hierarchical_allreduce(x, child, ranks_per_node=1)
    return weakref.ref(child)


def dropped_communicators_are_freed(comm: compcoll.Communicator) -> None:
    """A communicator that is no longer referenced is freed, with what was kept for it (plans, topologies,
    sub-communicators): no module-level table, and no ordering thread, keeps it alive. (Thread ranks' communicators
    reach one another, so every rank drops its own before any collects.)"""
    dropped = _use_and_drop(comm)
    comm.barrier()
    gc.collect()
    assert dropped() is None, f"a dropped communicator is still referenced by {gc.get_referrers(dropped())}"


def made_groups_end_with_their_communicators(comm: compcoll.Communicator) -> None:
    """Four hook-like states in turn, each on a group compcoll made (``own_comm``) with its node groups (the
    hierarchical form's splits), used, given a call that fails (``_refused``), and dropped: torch.distributed holds
    no more groups, and the process no more Gloo threads, after the fourth than after the first; once the retired
    ones are destroyed, as many as before. A communicator that stays, and one on the caller's own group, keep working
    throughout. A retired group that torch.distributed let go of meanwhile is freed at once."""
    held = dist.distributed_c10d._world.pg_map
    x = torch.arange(1001, dtype=torch.float32) * (comm.rank + 1)
    expected = torch.full((7,), float(sum(range(1, comm.size + 1))))
    groups.release_retired()
    before = (len(held), _gloo_threads())
    kept = own_comm(None, 30.0)
    users = TorchComm(dist.new_group(list(range(dist.get_world_size()))), 30.0)
    after = []
    for _ in range(4):
        made = own_comm(None, 30.0)
        compcoll.hierarchical_allreduce(x, made, ranks_per_node=1)
        _refused(made, x)
        del made
        gc.collect()
        after.append((len(held), _gloo_threads()))
        for each in (kept, users):
            total = torch.ones(7) * (comm.rank + 1)
            each.allreduce(total)
            assert torch.equal(total, expected), total
    made_groups, threads = zip(*after)
    assert max(made_groups) == made_groups[0] and threads[-1] <= threads[0], f"groups, threads after each: {after}"
    assert len(groups.RETIRED) == 3, groups.RETIRED  # the last state's group and its two node groups
    groups.release_retired()
    assert len(held) == before[0] + 2, "a group compcoll did not retire was destroyed, or one it retired was kept"
    assert users.group in held and kept.group in held
    del kept
    gc.collect()
    users.barrier()
    groups.release_retired()
    assert len(held) == before[0] + 1 and users.group in held
    dist.destroy_process_group(users.group)
    made = own_comm(None, 30.0)
    group = weakref.ref(made.group)
    del made
    gc.collect()
    assert len(groups.RETIRED) == 1
    dist.destroy_process_group(group())  # as a destroy_process_group() of the default group would
    gc.collect()
    assert group() is None, "a retired group outlived torch.distributed's hold on it"
    groups.release_retired()


def split_communicators_end_with_theirs(comm: compcoll.Communicator) -> None:
    """Four optimizer-like states in turn, each on an ``MPIComm`` of its own over the caller's MPI communicator, with
    its node communicators (the hierarchical form's two splits), used and dropped: each state's MPI communicators are
    freed at the next split (``MPI_Comm_free``), so a job that builds states again and again does not run MPI out of
    communicators (MPICH has room for 2,048). A split communicator that stays keeps working."""
    from mpi4py import MPI

    x = torch.arange(1001, dtype=torch.float32) * (comm.rank + 1)
    groups.release_retired()
    kept = comm.split(0)
    made_handles = []
    for _ in range(4):
        made = compcoll.MPIComm(comm.mpi_comm, timeout=30.0)
        compcoll.hierarchical_allreduce(x.clone(), made, ranks_per_node=1)
        layout = compcoll.topology(made, 1)
        made_handles.append((layout.intra.mpi_comm, layout.inter.mpi_comm))
        del made, layout
        gc.collect()
    freed = [[handle == MPI.COMM_NULL for handle in pair] for pair in made_handles]
    assert freed == [[True, True]] * 3 + [[False, False]], f"freed after the fourth state: {freed}"
    assert len(groups.RETIRED) == 2, groups.RETIRED
    groups.release_retired()
    assert all(handle == MPI.COMM_NULL for handle in made_handles[-1]) and kept.mpi_comm != MPI.COMM_NULL
    total = torch.ones(7) * (comm.rank + 1)
    kept.allreduce(total)
    assert torch.equal(total, torch.full((7,), float(sum(range(1, comm.size + 1))))), total


def _refused(comm: compcoll.Communicator, x: torch.Tensor) -> None:
    """A call rank 0 refuses (an int32 tensor): its TypeError, and every other rank's RemoteError from ``wait``,
    whose traceback holds the Work and its communicator."""
    full = compcoll.padded_numel(x.numel(), comm.size)
    try:
        compcoll.compressed_allreduce(x if comm.rank else x.to(torch.int32), torch.zeros(full),
                                      torch.zeros(full // comm.size), comm, async_op=True).wait()
    except (TypeError, compcoll.RemoteError):
        pass
    else:
        raise AssertionError("a call rank 0 refused went through")


def _gloo_threads() -> int:
    """This process's Gloo threads (each group's event loop and workers: ``gloo_tcp_loop``, ``pt_gloo_runloop``); not
    the ordering threads, which end on their own once idle (``comm.ordering.IDLE_SECONDS``)."""
    stats = (processes.proc_stat(f"/proc/self/task/{task}/stat") for task in os.listdir("/proc/self/task"))
    return sum(stat is not None and stat[0].startswith(("gloo", "pt_gloo")) for stat in stats)


def collectives(comm: compcoll.Communicator) -> None:
    """Each collective moves the right data and counts the documented bytes."""
    n, rank = comm.size, comm.rank
    block = 5
    send = torch.arange(n * block, dtype=torch.int64) + 1000 * rank
    recv = torch.empty_like(send)
    before, before_to = comm.bytes_sent, list(comm.bytes_sent_to)
    comm.alltoall(send, recv)
    assert comm.bytes_sent - before == (n - 1) * block * 8
    sent_to = [now - then for now, then in zip(comm.bytes_sent_to, before_to)]
    assert sent_to == [0 if r == rank else block * 8 for r in range(n)], sent_to
    for i in range(n):
        expected = torch.arange(rank * block, (rank + 1) * block) + 1000 * i
        assert torch.equal(recv[i * block:(i + 1) * block], expected), f"alltoall block from {i}"

    mine = torch.full((3,), rank, dtype=torch.uint8)
    for pairs_up_to in (compcoll.comm.base.PAIRWISE_RANKS, 1):  # pairs, then the transport's own, as above 64 ranks
        kept, compcoll.comm.base.PAIRWISE_RANKS = compcoll.comm.base.PAIRWISE_RANKS, pairs_up_to
        try:
            table = torch.empty(3 * n, dtype=torch.uint8)
            before = comm.bytes_sent
            comm.allgather(mine, table)
        finally:
            compcoll.comm.base.PAIRWISE_RANKS = kept
        assert comm.bytes_sent - before == (n - 1) * 3
        assert torch.equal(table, torch.arange(n, dtype=torch.uint8).repeat_interleave(3)), pairs_up_to

    for dtype in (torch.float32, torch.float64, torch.bfloat16):
        x = torch.full((16,), rank + 1.0, dtype=dtype)
        before = comm.bytes_sent
        comm.allreduce(x)
        assert comm.bytes_sent - before == 2 * (n - 1) * 16 * x.element_size() // n
        assert torch.all(x == n * (n + 1) / 2), f"allreduce {dtype}"

    root = n - 1
    b = torch.full((4,), float(rank), dtype=torch.bfloat16)
    comm.bcast(b, root=root)
    assert torch.all(b == root)
    comm.barrier()

    half = comm.split(rank % 2)
    assert half.size == (n + 1 - rank % 2) // 2 and half.rank == rank // 2
    assert (comm.job_rank, comm.job_size) == (half.job_rank, half.job_size) == (rank, n), "a split lost the job's rank"
    total = torch.tensor([float(rank)])
    before, before_to = comm.bytes_sent, list(comm.bytes_sent_to)
    half.allreduce(torch.zeros(3 * half.size))
    half.allgather(total.clone(), torch.empty(half.size))
    half.allreduce(total)
    assert total.item() == sum(r for r in range(n) if r % 2 == rank % 2)
    assert comm.bytes_sent - before == half.bytes_sent > 0 or half.size == 1
    assert sum(half.bytes_sent_to) == half.bytes_sent
    sent_to = [now - then for now, then in zip(comm.bytes_sent_to, before_to)]
    assert sent_to == [half.bytes_sent_to[r // 2] if r % 2 == rank % 2 else 0 for r in range(n)], sent_to
    assert sum(comm.bytes_sent_to) == comm.bytes_sent

    try:
        comm.allgather(torch.zeros(2), torch.zeros(2 * n + 1))
    except ValueError as exc:
        assert "allgather needs" in str(exc)
    else:
        raise AssertionError("a mis-sized allgather was accepted")
    comm.barrier()


def late_alltoall(comm: compcoll.Communicator, delay: float) -> None:
    """The last rank joins an all-to-all after the timeout (a sixth of ``delay``, so that CI's two busy cores do not
    make it look late): the others raise, not hang."""
    comm.timeout = delay / 6
    send, recv = torch.ones(4 * comm.size), torch.empty(4 * comm.size)
    if comm.rank == comm.size - 1:
        time.sleep(delay)
        return
    start = time.monotonic()
    try:
        comm.alltoall(send, recv)
    except compcoll.CollectiveTimeout as exc:
        assert "alltoall" in str(exc) and "did not complete within" in str(exc), exc
    else:
        raise AssertionError("the all-to-all completed without the last rank")
    assert time.monotonic() - start < delay, "the timeout fired late"


def mpi_library(comm: compcoll.Communicator) -> None:
    """Each rank prints the name of the MPI library it runs on."""
    from mpi4py import MPI

    print(f"rank {comm.rank}: {MPI.Get_library_version().split(',')[0]}")


def finalized_before_teardown(comm: compcoll.Communicator, folder: str) -> None:
    """Rank 0's all-to-all times out while rank 1 sleeps; every rank then returns as a program that caught the error
    would. A handler registered first (so run last of the ``atexit`` handlers, before Python tears its modules down)
    writes whether MPI is finalized then: on rank 0, whose communicator broke, it is (its pending operations' buffers
    still alive), on rank 1 not (mpi4py finalizes it after the teardown, as ever)."""
    import atexit

    from mpi4py import MPI

    path = pathlib.Path(folder, str(comm.rank))
    atexit.register(lambda: path.write_text(str(int(MPI.Is_finalized()))))
    comm.timeout = 0.5
    send, recv = torch.ones(4 * comm.size), torch.empty(4 * comm.size)
    if comm.rank == 1:
        time.sleep(3.0)
        return
    try:
        comm.alltoall(send, recv)
    except compcoll.CollectiveTimeout:
        return
    raise AssertionError("the all-to-all completed without rank 1")


def dropped_work_completes(comm: compcoll.Communicator) -> None:
    """Rank 0 starts an all-to-all and drops its handle at once; rank 2 joins only after that; after a barrier
    rank 0's receive buffer still gets every part.

    The communicator holds its operations until they complete, whoever dropped their handles, so the transport
    still has somewhere to put what comes: over Gloo, a receive freed before its data came would leave the data
    in the socket, and Gloo's event loop would then poll that socket at full speed for the life of the process
    (and rank 0's sends would never go). The barrier lets MPI, which moves data only inside a rank's MPI calls,
    deliver it.
    """
    n, rank = comm.size, comm.rank
    comm.timeout = 20.0
    folder = pathlib.Path(tempfile.gettempdir(), f"compcoll-dropped-work-{_pids(comm)[0]}")
    send, recv = torch.full((4 * n,), float(rank)), torch.full((4 * n,), -1.0)
    if rank == 0:
        kept = weakref.ref(comm.alltoall(send, recv, async_op=True))
        gc.collect()
        folder.mkdir()
    else:
        if rank == 2:
            _wait_for_path(folder, 30.0)
        comm.alltoall(send, recv)
    comm.barrier()
    expected = torch.arange(n, dtype=torch.float32).repeat_interleave(4)
    if rank == 0:
        folder.rmdir()
        assert kept() is not None, "the communicator let go of an operation in flight"
        deadline = time.monotonic() + 30.0
        while not torch.equal(recv, expected) and time.monotonic() < deadline:
            time.sleep(0.01)
    assert torch.equal(recv, expected), f"rank {rank} received {recv.tolist()}"


def fire_and_forget(comm: compcoll.Communicator) -> None:
    """30 rounds of 10 asynchronous allreduces whose handles are dropped unwaited, each round closed by a barrier
    (which the unwaited ones complete before): the communicator holds fewer than twice ``HELD_BEFORE_PRUNE`` of the
    300, since it tests those it holds as they pile up."""
    limit = 2 * compcoll.comm.base.HELD_BEFORE_PRUNE
    for _ in range(30):
        for _ in range(10):
            comm.allreduce(torch.full((5,), float(comm.rank)), async_op=True)
        comm.barrier()
    assert len(comm._in_flight) < limit, f"{len(comm._in_flight)} operations held after 300 unwaited ones"


def _wait_for_path(path: pathlib.Path, limit: float) -> None:
    """Wait until ``path`` exists; AssertionError past ``limit`` seconds."""
    deadline = time.monotonic() + limit
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.02)


def started_collectives(comm: compcoll.Communicator) -> None:
    """async_op=True: several operations in flight at once, bytes counted at the start, results through wait and
    futures; time blocked on a late peer counted in wait_seconds."""
    n, rank = comm.size, comm.rank
    send = torch.arange(3 * n, dtype=torch.float32) + 100 * rank
    recv = torch.empty_like(send)
    mine, table = torch.full((2,), rank, dtype=torch.int64), torch.empty(2 * n, dtype=torch.int64)
    total = torch.full((7,), rank + 1.0)
    shared = torch.full((5,), float(rank), dtype=torch.float16)
    before = comm.bytes_sent
    works = [comm.alltoall(send, recv, async_op=True), comm.allgather(mine, table, async_op=True),
             comm.allreduce(total, async_op=True), comm.bcast(shared, root=0, async_op=True)]
    counted = (n - 1) * 3 * 4 + (n - 1) * 2 * 8 + 2 * (n - 1) * 7 * 4 // n + (5 * 2 if rank == 0 and n > 1 else 0)
    assert comm.bytes_sent - before == counted, "bytes were not counted when the operations started"
    future = works[1].get_future()
    assert works[2].wait() is total and works[0].wait() is recv and works[3].wait() is shared
    assert torch.equal(future.wait(), torch.arange(n, dtype=torch.int64).repeat_interleave(2))
    assert all(work.is_completed() for work in works)
    for i in range(n):
        assert torch.equal(recv[3 * i:3 * i + 3], torch.arange(3 * rank, 3 * rank + 3) + 100.0 * i), f"block from {i}"
    assert torch.all(total == n * (n + 1) / 2) and torch.all(shared == 0)
    comm.barrier(async_op=True).wait()
    if n > 1:
        comm.barrier()
        if rank == n - 1:
            time.sleep(0.5)
        waited = comm.wait_seconds
        comm.allgather(mine, table)
        if rank != n - 1:
            assert comm.wait_seconds - waited >= 0.25, "the wait for a late peer was not counted in wait_seconds"


def _pids(comm: compcoll.Communicator) -> list[int]:
    table = torch.empty(comm.size, dtype=torch.int64)
    comm.allgather(torch.tensor([os.getpid()], dtype=torch.int64), table)
    return table.tolist()


def _calls_until_error(comm: compcoll.Communicator, numel: int, limit: float) -> tuple[compcoll.CompcollError, float]:
    """compressed_allreduce in a loop until it raises; (the error, seconds since the last call that completed)."""
    x = torch.randn(numel)
    full = compcoll.padded_numel(numel, comm.size)
    we, se = torch.zeros(full), torch.zeros(full // comm.size)
    last = time.monotonic()
    while time.monotonic() - last < limit:
        try:
            compcoll.compressed_allreduce(x, we, se, comm)
        except compcoll.CompcollError as exc:
            return exc, time.monotonic() - last
        last = time.monotonic()
    raise AssertionError(f"no error within {limit} s of the last call")


def stalled_rank(comm: compcoll.Communicator, where: str) -> None:
    """The last rank stops (SIGSTOP) between two calls or at some point inside a loop of calls.

    The others raise ``CollectiveTimeout`` (or, over Gloo, an error naming a peer that had
    already timed out and dropped its connections, or inside a Gloo collective, which cannot
    name it, saying that a peer did) within twice the timeout of their last completed
    call (each operation of a call has the whole timeout from its start). When the stop fell
    between calls the message names the stopped rank, alone. Inside a call, a peer still
    waiting on the stopped rank in the call before is missing from the next agreement round
    as well, so the names then include the stopped rank or are empty (all ranks inside a
    call's larger collectives, where nothing can say who is missing). Once every other rank
    has raised (each leaves a file), rank 0 wakes it (SIGCONT): woken earlier, it could
    complete a collective with a peer still waiting and so give that peer a later call.
    Its next calls fail too (its peers have left), so every rank ends with an error and
    none hangs.
    """
    pids = _pids(comm)
    last = comm.size - 1
    start = time.monotonic()
    if comm.rank == last:
        if where == "between":
            os.kill(os.getpid(), signal.SIGSTOP)
        else:
            threading.Timer(0.5, os.kill, (os.getpid(), signal.SIGSTOP)).start()
        exc, _ = _calls_until_error(comm, 300000, 4 * comm.timeout)
        return
    exc, quiet = _calls_until_error(comm, 300000, 4 * comm.timeout)
    raised = pathlib.Path(tempfile.gettempdir(), f"compcoll-stalled-{pids[0]}")
    raised.mkdir(exist_ok=True)
    (raised / str(comm.rank)).touch()
    try:
        assert quiet < 2 * comm.timeout, f"raised {quiet:.2f} s after the last call (timeout {comm.timeout} s)"
        if not isinstance(exc, compcoll.CollectiveTimeout):
            assert "die or leave?" in str(exc), f"expected a timeout or a peer that left, got {exc!r}"
        elif where == "between":
            assert exc.absent == [last] and f"rank(s) {last}" in str(exc), exc
        else:
            assert not exc.absent or last in exc.absent, exc
    finally:
        if comm.rank == 0:
            while len(list(raised.iterdir())) < last and time.monotonic() - start < 8 * comm.timeout:
                time.sleep(0.05)
            os.kill(pids[last], signal.SIGCONT)
            shutil.rmtree(raised)


def dead_rank(comm: compcoll.Communicator, before: str) -> None:
    """The last rank dies (SIGKILL) before a call or before an all-gather of Gloo's ring: the others raise at once.

    "At once" is well inside the timeout (a third of it): on CI's 2 busy cores the error came 2.6-2.8 s after the
    last call that completed, where a rank that waited for the timeout would raise after all of it.

    Before a call, its first exchange (point to point) names the dead rank: posting a send to it fails, or, where
    Gloo had not yet seen the reset when the send was posted, waiting for its part does (CI saw both). Gloo's
    ring all-gather cannot say which peer dropped its connection; the error says a peer
    did. The others stay a moment after their error: a rank that got there after a peer
    had left would name that peer instead (it did leave). Over Gloo the last rank dies
    only once each other rank has sent it a word after its own init: a rank still
    connecting its group when a peer died would fail in its init instead.
    """
    last = comm.size - 1
    if torch.distributed.is_initialized():
        word = torch.zeros(1)
        if comm.rank == last:
            for peer in range(last):
                torch.distributed.recv(word, src=peer)
        else:
            torch.distributed.send(word, dst=last)
    if comm.rank == last:
        os.kill(os.getpid(), signal.SIGKILL)
    if before == "call":
        exc, quiet = _calls_until_error(comm, 1000, 4 * comm.timeout)
        expected = (f"did rank {last} die", f"receiving from rank {last}: did it die")
    else:
        numel = 2 * compcoll.comm.base.PAIRWISE_BYTES  # floats: past the point-to-point exchange
        send, recv = torch.randn(numel), torch.empty(numel * comm.size)
        start = time.monotonic()
        try:
            comm.allgather(send, recv)
        except compcoll.CompcollError as raised:
            exc, quiet = raised, time.monotonic() - start
        else:
            raise AssertionError("the all-gather completed without its dead peer")
        expected = ("a peer dropped its connection",)
    assert quiet < comm.timeout / 3, f"raised {quiet:.2f} s after the peer left (timeout {comm.timeout} s)"
    assert any(words in str(exc) for words in expected), exc
    time.sleep(2.0)


def subgroups_split_alone(comm: compcoll.Communicator) -> None:
    """A 2-D job: data-parallel groups {0, 2} and {1, 3}. A TorchComm over each splits (``topology``, which a 1-bit
    Adam builds) with its own ranks alone, into groups of their own: the two groups' splits are not one torch group
    name (the default group's ``new_group``, called by each group's ranks for their own members, named both alike,
    so their rendezvous could cross, and waited forever when the two groups' calls differed). A 1-bit Adam on each
    keeps its group's replicas identical while the two groups train apart. ``compcoll.checkpoint`` names each
    process's file by its rank in the job (by the group's rank, the two groups' ranks 0 wrote one file, and one
    group resumed with the other's error buffers, with nothing said): 4 files, and each optimizer resumes its own
    state, the next step with the bits of the run that went on."""
    rank = dist.get_rank()
    groups = [dist.new_group([0, 2]), dist.new_group([1, 3])]
    data_parallel = TorchComm(groups[rank % 2])
    half = data_parallel.split(0)
    assert (half.size, half.rank) == (2, rank // 2)
    assert (data_parallel.job_rank, data_parallel.job_size) == (half.job_rank, half.job_size) == (rank, 4)
    names = [None] * 4
    dist.all_gather_object(names, half.group.group_name)
    assert names[rank] == names[(rank + 2) % 4] != names[(rank + 1) % 4], names
    torch.manual_seed(rank % 2)
    net = torch.nn.Linear(13, 5)
    opt = OneBitAdam(net.parameters(), lr=1e-2, freeze_step=2, comm=data_parallel)

    def train(net: torch.nn.Module, opt: OneBitAdam, steps: range) -> torch.Tensor:
        for step in steps:
            opt.zero_grad()
            x = torch.randn(4, 13, generator=torch.Generator().manual_seed(10 * step + rank))
            net(x).square().mean().backward()
            opt.step()
        return torch.cat([p.detach().reshape(-1) for p in net.parameters()])

    train(net, opt, range(4))
    folder = [tempfile.mkdtemp() if rank == 0 else None]
    dist.broadcast_object_list(folder)
    compcoll.checkpoint.save(folder[0], opt)
    model = {key: value.clone() for key, value in net.state_dict().items()}
    flat = train(net, opt, range(4, 5))
    dist.barrier()
    assert sorted(os.listdir(folder[0])) == [f"compcoll-rank{r}-of-4.pt" for r in range(4)], os.listdir(folder[0])
    resumed = torch.nn.Linear(13, 5)
    resumed.load_state_dict(model)
    opt = OneBitAdam(resumed.parameters(), lr=1e-2, freeze_step=2, comm=data_parallel)
    compcoll.checkpoint.load(folder[0], opt)
    assert torch.equal(train(resumed, opt, range(4, 5)), flat), "a data-parallel group resumed another's state"
    dist.barrier()
    if rank == 0:
        shutil.rmtree(folder[0])
    table = [torch.empty_like(flat) for _ in range(4)]
    dist.all_gather(table, flat)
    assert torch.equal(table[rank], table[(rank + 2) % 4]), "a data-parallel group's replicas differ"
    assert not torch.equal(table[rank], table[(rank + 1) % 4]), "the two data-parallel groups trained alike"


def entry_points_refuse_a_process_group(comm: compcoll.Communicator) -> None:
    """Every entry point that takes a ``comm``, given torch.distributed's own group (what a torch.distributed user
    passes first), raises TypeError naming itself and ``compcoll.TorchComm(group)`` (before 2026-12-03: "'>' not
    supported between instances of 'method' and 'int'" from deep inside), with nothing sent; ``comm`` still works."""
    from compcoll.optim import OneBitAdam, broadcast_buffers

    x = torch.randn(1001)
    full = compcoll.padded_numel(x.numel(), comm.size)
    we, se = torch.zeros(full), torch.zeros(full // comm.size)
    calls = {"compressed_allreduce": lambda g: compcoll.compressed_allreduce(x, we, se, g),
             "hierarchical_compressed_allreduce": lambda g: compcoll.hierarchical_compressed_allreduce(x, we, se, g),
             "hierarchical_allreduce": lambda g: compcoll.hierarchical_allreduce(x, g),
             "compressed_reduce_scatter": lambda g: compcoll.compressed_reduce_scatter(x, torch.empty(1), we, g),
             "CompressedAllreduce": lambda g: compcoll.CompressedAllreduce(g),
             "OneBitAdam": lambda g: OneBitAdam(torch.nn.Linear(3, 2).parameters(), comm=g),
             "broadcast_buffers": lambda g: broadcast_buffers(torch.nn.BatchNorm1d(3), comm=g)}
    sent = comm.bytes_sent
    for what, call in calls.items():
        try:
            call(dist.group.WORLD)
        except TypeError as exc:
            assert str(exc).startswith(f"{what}: comm must be a compcoll Communicator") and \
                "compcoll.TorchComm(group)" in str(exc), exc
        else:
            raise AssertionError(f"{what} took a ProcessGroup for its comm")
    assert comm.bytes_sent == sent, "a refused call sent bytes"
    total = torch.ones(3)
    comm.allreduce(total)
    assert torch.equal(total, torch.full((3,), float(comm.size))), total


def in_stream_order(comm: compcoll.Communicator) -> None:
    """A TorchComm whose blocking collectives are issued in stream order (``in_stream_order``, NCCL's; set here on
    Gloo) issues them through torch.distributed's blocking form (``async_op=False``) and holds no work for them:
    each moves the same data and counts the same bytes (``collectives``); an asynchronous one is still issued with
    ``async_op=True`` and waited for. A ``compressed_allreduce`` with its agreement rounds summed (an allreduce, as
    above 64 ranks) gives the same bits either way, on every rank."""
    assert isinstance(comm, TorchComm) and not comm.in_stream_order
    issued: list[tuple[str, bool]] = []
    real = {name: getattr(dist, name) for name in ("all_reduce", "broadcast", "all_to_all_single")}

    def spied(name: str):
        def call(*args, **kwargs):
            issued.append((name, kwargs["async_op"]))
            return real[name](*args, **kwargs)
        return call

    n, x = comm.size, torch.randn(100003, generator=torch.Generator().manual_seed(comm.rank))
    full = compcoll.padded_numel(x.numel(), n)
    kept = compcoll.spec.GATHERED_AGREEMENT_RANKS
    results = {}
    try:
        compcoll.spec.GATHERED_AGREEMENT_RANKS = 0
        for name in real:
            setattr(dist, name, spied(name))
        for ordered in (False, True):
            comm.in_stream_order = ordered
            issued.clear()
            total = torch.ones(5)
            comm.allreduce(total)
            comm.bcast(total, root=n - 1)
            assert torch.all(total == n), total
            assert issued == [("all_reduce", not ordered), ("broadcast", not ordered)], issued
            issued.clear()
            work = comm.allreduce(total, async_op=True)
            assert issued == [("all_reduce", True)] and torch.all(work.wait() == n * n), issued
            results[ordered] = compcoll.compressed_allreduce(x, torch.zeros(full), torch.zeros(full // n), comm)
            assert ("all_reduce", not ordered) in issued, issued
        collectives(comm)
    finally:
        compcoll.spec.GATHERED_AGREEMENT_RANKS = kept
        for name, fn in real.items():
            setattr(dist, name, fn)
        comm.in_stream_order = False
    assert torch.equal(results[True], results[False])
    table = torch.empty(n * results[True].numel())
    comm.allgather(results[True], table)
    assert all(torch.equal(row, results[True]) for row in table.view(n, -1)), "ranks' results differ"
