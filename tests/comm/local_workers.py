"""Rank-side bodies of the in-process world's tests: a digest of every 1-bit form's bits, to compare transports."""

from __future__ import annotations

import hashlib
import threading
from pathlib import Path

import torch

import compcoll
from compcoll.kernels import reference
from compcoll.spec import SCALE_BYTES
from tests.algorithms.onebit_workers import make_input
from tests.shared import world_once


def digest(comm: compcoll.Communicator, directory: str, transport: str) -> None:
    """Write the SHA-256 of this rank's outputs and error buffers over 3 steps of every 1-bit form to
    ``directory/{transport}-{rank}``: compressed_allreduce (both protocols, both scales, 3 pieces), the
    compensated hierarchical form and Birder's, on nodes of 2 and of 8 where the ranks form several (else one rank a
    node)."""
    n = comm.size
    sha = hashlib.sha256()
    nodes = [k for k in (2, 8) if n % k == 0 and n > k] or [1]
    for shape in ((37,), (3, 7, 11), (12289,)):
        numel = int(torch.tensor(shape).prod())
        full = compcoll.padded_numel(numel, n)
        for protocol, scale, pieces in (("gather_scatter", "l2", None), ("gather_scatter", "l1", 3),
                                        ("allgather", "l1", None)):
            we, se = torch.zeros(full), torch.zeros(full // n)
            for step in range(3):
                out = compcoll.compressed_allreduce(make_input(comm.rank, step, shape, torch.float32), we, se, comm,
                                                    protocol=protocol, scale=scale, pieces=pieces)
                for t in (out, we, se):
                    sha.update(t.contiguous().view(torch.uint8).numpy().tobytes())
        for k in nodes:
            wn, sn = compcoll.hierarchical_error_numels(numel, n, k)
            hwe, hse = torch.zeros(wn), torch.zeros(sn)
            for step in range(3):
                x = make_input(comm.rank, step, shape, torch.float32)
                out = compcoll.hierarchical_compressed_allreduce(x, hwe, hse, comm, ranks_per_node=k)
                birder = compcoll.hierarchical_allreduce(x, comm, ranks_per_node=k, seed=3, step=step)
                for t in (out, hwe, hse, birder):
                    sha.update(t.contiguous().view(torch.uint8).numpy().tobytes())
    Path(directory, f"{transport}-{comm.rank}").write_text(sha.hexdigest())


def a_rank_that_never_arrives(comm: compcoll.Communicator) -> None:
    """The last rank never calls (it waits, without returning, until the others are done): they raise
    CollectiveTimeout naming it, then CommunicatorBroken."""
    comm.timeout = 1.0
    if comm.rank == comm.size - 1:
        _wait_for_the_others(comm)
        return
    x = torch.randn(100, generator=torch.Generator().manual_seed(comm.rank))
    full = compcoll.padded_numel(100, comm.size)
    try:
        compcoll.compressed_allreduce(x, torch.zeros(full), torch.zeros(full // comm.size), comm)
    except compcoll.CollectiveTimeout as exc:
        assert exc.absent == [comm.size - 1], exc.absent
        assert f"nothing arrived from rank(s) {comm.size - 1}" in str(exc), exc
    else:
        raise AssertionError("no CollectiveTimeout")
    try:
        comm.barrier()
    except compcoll.CommunicatorBroken:
        pass
    else:
        raise AssertionError("the communicator still worked after a timeout")
    finally:
        _DONE.release()


_DONE = threading.Semaphore(0)


def _wait_for_the_others(comm: compcoll.Communicator) -> None:
    """Block until every other rank of this world has released ``_DONE`` once (the world's ranks are this process's
    threads)."""
    for _ in range(comm.size - 1):
        if not _DONE.acquire(timeout=120):
            raise AssertionError("the other ranks did not end within 120 s")


def a_rank_that_returns_early(comm: compcoll.Communicator) -> None:
    """Four ranks split in halves {0, 1} and {2, 3}; rank 3 starts a ``compressed_allreduce`` and an allgather of
    the world and returns without waiting for them.

    Both still complete on every rank (the allgather queued behind the allreduce's collectives, all issued before
    rank 3 counts as left); the half {0, 1}, which rank 3 is not in, goes on; rank 2's allgather of its half, and
    then its barrier of the world, raise RankMismatchError naming rank 3 (rank 1 of its half) at once, where they
    would raise CollectiveTimeout after 30 s.
    """
    comm.timeout = 30.0
    half = comm.split(comm.rank // 2)
    mine = torch.full((2,), float(comm.rank))
    every = torch.arange(comm.size, dtype=torch.float32).repeat_interleave(2)
    gathered = torch.zeros(2 * comm.size)
    x = torch.randn(1001, generator=torch.Generator().manual_seed(comm.rank))
    full = compcoll.padded_numel(x.numel(), comm.size)
    errors = torch.zeros(full), torch.zeros(full // comm.size)
    if comm.rank == 3:
        compcoll.compressed_allreduce(x, *errors, comm, async_op=True)
        comm.allgather(mine, gathered, async_op=True)
        return
    compcoll.compressed_allreduce(x, *errors, comm)
    comm.allgather(mine, gathered)
    assert torch.equal(gathered, every), gathered
    halves = torch.zeros(2 * half.size)
    if comm.rank < 2:
        half.allgather(mine, halves)
        assert torch.equal(halves, every[:4]), halves
        return
    try:
        half.allgather(mine, halves)
    except compcoll.RankMismatchError as exc:
        expected = ("rank(s) 1 of 2 returned from their function without calling the allgather that rank 0 waits "
                    "in: the ranks' calls are out of step")
        assert str(exc) == f"in-process world: {expected}", exc
    else:
        raise AssertionError("an allgather completed without rank 3")
    try:
        comm.barrier()
    except compcoll.RankMismatchError as exc:
        assert "without calling the barrier that rank 2 waits in" in str(exc), exc
        assert "3" in str(exc).split(" of 4 returned")[0], exc
    else:
        raise AssertionError("a barrier completed without rank 3")


def one_rank_fails(comm: compcoll.Communicator) -> None:
    """Every rank splits the world into one communicator, then rank 1 raises; the others wait in an allgather of the
    split one."""
    split = comm.split(0, comm.rank)
    if comm.rank == 1:
        raise ValueError("rank 1 fails on purpose")
    split.allgather(torch.ones(2), torch.zeros(2 * split.size))


def calls_out_of_step(comm: compcoll.Communicator) -> None:
    """Rank 0 calls an allgather of 3 float64 where rank 1 calls an all-to-all of 5 bytes to each rank."""
    if comm.rank == 0:
        comm.allgather(torch.ones(3, dtype=torch.float64), torch.zeros(3 * comm.size, dtype=torch.float64))
    else:
        comm.alltoall(torch.ones(5 * comm.size, dtype=torch.uint8), torch.zeros(5 * comm.size, dtype=torch.uint8))


def counts_bytes(comm: compcoll.Communicator, numel: int) -> None:
    """A flat gather-scatter call (after the first of its size) sends, per rank: its agreement round with the scale
    (``reference.agreement_sent``: an all-gather of float64 fields up to 64 ranks, an allreduce of fixed size and the
    scale above), and to each of the n-1 others a chunk of padded_numel/(8n) sign bytes in the all-to-all and its
    framed server chunk in the all-gather."""
    n = comm.size
    full = compcoll.padded_numel(numel, n)
    x = torch.randn(numel, generator=torch.Generator().manual_seed(comm.rank))
    we, se = torch.zeros(full), torch.zeros(full // n)
    compcoll.compressed_allreduce(x, we, se, comm)  # the first call of a size also agrees on its plan's options
    before = comm.bytes_sent
    compcoll.compressed_allreduce(x, we, se, comm)
    chunk_bytes = full // n // 8
    agreement = world_once(comm, reference.agreement_sent, n, (True,))[comm.rank]
    expected = (n - 1) * (chunk_bytes + SCALE_BYTES + chunk_bytes) + agreement
    assert comm.bytes_sent - before == expected, f"rank {comm.rank} of {n}: {comm.bytes_sent - before} != {expected}"
