"""MPIComm and TorchComm collectives on 1-4 ranks; SingleComm in process."""

from __future__ import annotations

import time

import pytest
import torch

import compcoll
from compcoll import launcher
from compcoll.launcher import BACKENDS, WorkerFailure
from tests.pool import run


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("world_size", [1, 2, 3, 4])
def test_collectives(backend: str, world_size: int) -> None:
    run("tests.comm.comm_workers:collectives", world_size, backend)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("world_size", [1, 3])
def test_started_collectives(backend: str, world_size: int) -> None:
    run("tests.comm.comm_workers:started_collectives", world_size, backend)


def test_blocking_collectives_in_stream_order_use_the_blocking_form() -> None:
    """``TorchComm.in_stream_order`` (NCCL's: its blocking collectives on the current stream), set on 3 Gloo ranks:
    the same data, bytes and bits (``tests/comm/comm_workers.py``'s ``in_stream_order``)."""
    run("tests.comm.comm_workers:in_stream_order", 3, "gloo", timeout=90)


def test_a_data_parallel_subgroup_splits_without_the_other_groups() -> None:
    run("tests.comm.comm_workers:subgroups_split_alone", 4, "gloo", timeout=60)


@pytest.mark.parametrize("backend", ["threads", *BACKENDS])
def test_dropped_communicators_are_freed(backend: str) -> None:
    run("tests.comm.comm_workers:dropped_communicators_are_freed", 2, backend)


def test_small_all_gathers_go_as_pairs_up_to_64_ranks() -> None:
    """Point-to-point pairs name the silent ranks on a timeout, but take n - 1 messages a rank: up to 4 KiB a rank on
    up to 64 ranks (where an agreement round all-gathers), then the transport's own all-gather
    (``tests/comm/comm_workers.py``'s ``collectives`` runs both)."""
    from compcoll.comm.base import PAIRWISE_BYTES, pairs_small

    assert pairs_small(64, PAIRWISE_BYTES) and pairs_small(2, 8)
    assert not pairs_small(65, 8) and not pairs_small(1024, 8) and not pairs_small(4, PAIRWISE_BYTES + 1)


def test_single_comm() -> None:
    comm = compcoll.SingleComm()
    x = torch.arange(4.0)
    y = torch.empty(4)
    comm.alltoall(x, y)
    assert torch.equal(x, y) and comm.bytes_sent == 0
    comm.allreduce(x)
    assert torch.equal(x, torch.arange(4.0))
    assert comm.split(3).size == 1


def test_collectives_reject_non_flat_tensors() -> None:
    with pytest.raises(ValueError, match="contiguous 1-D"):
        compcoll.SingleComm().allreduce(torch.zeros(2, 2))


def test_broken_communicator_refuses_work() -> None:
    comm = compcoll.SingleComm()
    assert comm.broken is None
    comm._broken = "CollectiveTimeout: test"
    assert comm.broken == "CollectiveTimeout: test"
    with pytest.raises(compcoll.CommunicatorBroken, match="unusable"):
        comm.barrier()


@pytest.mark.parametrize("backend", BACKENDS)
def test_alltoall_times_out_instead_of_hanging(backend: str) -> None:
    run("tests.comm.comm_workers:late_alltoall", 3, backend, args=(3.0,), timeout=60, breaks=True)


@pytest.mark.parametrize("backend", ["threads", *BACKENDS])
def test_an_operation_whose_handle_was_dropped_still_completes(backend: str) -> None:
    run("tests.comm.comm_workers:dropped_work_completes", 3, backend, timeout=90)


@pytest.mark.parametrize("backend", ["threads", *BACKENDS])
def test_unwaited_operations_are_let_go_once_complete(backend: str) -> None:
    run("tests.comm.comm_workers:fire_and_forget", 3, backend, timeout=120)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("where", ["between", "inside"])
def test_a_stopped_rank_makes_the_others_time_out_naming_it(backend: str, where: str) -> None:
    run("tests.comm.comm_workers:stalled_rank", 3, backend, args=(where,), timeout=90, env={"COMPCOLL_TIMEOUT": "3"},
        breaks=True)


@pytest.mark.parametrize("before", ["call", "ring allgather"])
def test_a_dead_rank_fails_the_others_at_once_over_gloo(before: str) -> None:
    with pytest.raises(WorkerFailure) as failure:  # fresh ranks, not a pool's: the case kills one
        launcher.run("tests.comm.comm_workers:dead_rank", 3, "gloo", args=(before,), timeout=60,
                     env={"COMPCOLL_TIMEOUT": "30"})
    report = str(failure.value)
    assert "process 2 exited with -9" in report and "FAILED" not in report, report


def test_a_dead_rank_ends_the_mpi_job() -> None:
    """mpiexec (MPICH's Hydra) ends every rank when one dies; nobody waits for the timeout (120 s here; the job,
    three fresh ranks, takes 6-14 s on 2 busy cores)."""
    start = time.monotonic()
    report = ""
    try:
        launcher.run("tests.comm.comm_workers:dead_rank", 3, "mpi", args=("call",), timeout=180,
                     env={"COMPCOLL_TIMEOUT": "120"})
    except WorkerFailure as failure:
        report = str(failure)
    assert time.monotonic() - start < 60, report[-5000:]


def test_entry_points_refuse_a_process_group_for_their_comm() -> None:
    run("tests.comm.comm_workers:entry_points_refuse_a_process_group", 2, "gloo")
