"""The in-process world (compcoll.comm.local_world, the launcher's "threads"): MPI's and Gloo's bits and behaviour."""

from __future__ import annotations

import pytest

from compcoll.comm import local_world
from compcoll.launcher import WorkerFailure
from tests import background
from tests.pool import run
from tests.thread_jobs import Batch

SHAPES = [[1], [37], [3, 7, 11], [12289], [100003]]


def _digests(directory, transport: str, n: int) -> list[str]:
    return [(directory / f"{transport}-{r}").read_text() for r in range(n)]


@pytest.mark.parametrize("world_size", [1, 2, 3, 4])
def test_the_same_bits_as_mpi_and_gloo(world_size: int, tmp_path) -> None:
    """Every 1-bit form (both protocols and scales, pieces, the compensated hierarchical form, Birder's) gives
    threads the bits of MPI ranks and of Gloo ranks, on every rank."""
    for transport in ("threads", "mpi", "gloo"):
        run("tests.comm.local_workers:digest", world_size, transport, args=(str(tmp_path), transport))
    threads = _digests(tmp_path, "threads", world_size)
    assert threads == _digests(tmp_path, "mpi", world_size) == _digests(tmp_path, "gloo", world_size)


SUITES_BODIES = [
    ("tests.algorithms.onebit_workers:numerics", (SHAPES, 3), [1, 2, 3, 4]),
    ("tests.algorithms.onebit_workers:in_place_and_stateful", (), [1, 3]),
    ("tests.algorithms.onebit_workers:bad_inputs", (), [1, 2, 4]),
    ("tests.algorithms.pipeline_workers:pieces_match_reference", (SHAPES[:4], 2), [1, 3, 4]),
    ("tests.algorithms.launch_workers:in_flight", (SHAPES[:4], 2), [2, 3]),
    ("tests.algorithms.launch_workers:errors_through_wait", (), [3]),
    ("tests.algorithms.hierarchical_workers:numerics", (2, SHAPES[:4], 2), [4]),
    ("tests.optim.optim_workers:replicas", ("OneBitAdam",), [1, 4]),
    ("tests.optim.optim_workers:replicas", ("ZeroOneAdam",), [3]),
    ("tests.optim.optim_workers:nonfinite", ("OneBitLamb", 9, "skip"), [2]),
]
SUITES_JOB = Batch(*((target, n, args) for target, args, sizes in SUITES_BODIES for n in sizes))


@pytest.mark.parametrize("target, args, sizes", SUITES_BODIES)
@background.job(SUITES_JOB.make)
def test_the_transport_suites_bodies_pass_on_threads(target: str, args: tuple, sizes: list[int]) -> None:
    """The bodies that test compcoll over MPI and Gloo, against the numpy reference, pass on the in-process world
    (in a background job: ``tests/thread_jobs.py``)."""
    for n in sizes:
        SUITES_JOB.run(target, n, "threads", args=args)


def test_a_rank_that_never_arrives_times_out_the_others() -> None:
    run("tests.comm.local_workers:a_rank_that_never_arrives", 3, "threads", timeout=60)


def test_a_rank_that_returns_early_fails_the_calls_that_wait_for_it_at_once() -> None:
    """As a rank that leaves an MPI job before a collective: the ranks that wait for it raise ``RankMismatchError``
    naming it, where MPI and Gloo would wait out the timeout; what it issued before it left completes."""
    run("tests.comm.local_workers:a_rank_that_returns_early", 4, "threads", timeout=600)


def test_a_rank_that_fails_ends_the_world_and_the_others_raise_at_once() -> None:
    """As a failed MPI rank ends its job: the other ranks, waiting in a communicator split from the world, raise
    ``CommunicatorBroken`` naming the failed rank and its error, where they would wait out the timeout."""
    with pytest.raises(WorkerFailure) as failure:
        run("tests.comm.local_workers:one_rank_fails", 3, "threads", timeout=600)
    message = str(failure.value)
    assert "still running" not in message and "3 failed" in message, message
    assert "ValueError: rank 1 fails on purpose" in message, message
    ended = "the world ended while it waited (rank 1 failed: ValueError: rank 1 fails on purpose)"
    assert message.count(ended) == 2, message


def test_calls_out_of_step_raise_naming_both() -> None:
    """Ranks' calls meet by their order: an allgather meeting an all-to-all raises ``RankMismatchError`` naming both
    calls and ranks, on both ranks."""
    with pytest.raises(WorkerFailure) as failure:
        run("tests.comm.local_workers:calls_out_of_step", 2, "threads", timeout=600)
    message = str(failure.value)
    first = "rank 1's alltoall of 10 x torch.uint8 met rank 0's allgather of 3 x torch.float64 as collective number 0"
    second = "rank 0's allgather of 3 x torch.float64 met rank 1's alltoall of 10 x torch.uint8 as collective number 0"
    error = f"RankMismatchError: in-process world: {first if first in message else second}"
    assert message.count(error) == 2, message
    assert "still running" not in message and "2 failed" in message, message


BYTES_JOB = Batch(*(("tests.comm.local_workers:counts_bytes", n, (10007,)) for n in (2, 16, 256)))


@pytest.mark.parametrize("world_size", [2, 16, 256])
@background.job(BYTES_JOB.make)
def test_bytes_counted_as_the_formula(world_size: int) -> None:
    """In a background job (``tests/thread_jobs.py``): 256 ranks take 10 s of one core."""
    BYTES_JOB.run("tests.comm.local_workers:counts_bytes", world_size, "threads", args=(10007,))


def test_a_world_needs_ranks() -> None:
    with pytest.raises(ValueError, match="positive number of ranks"):
        local_world(0)
