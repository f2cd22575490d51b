"""compressed_allreduce against the numpy reference, on 1-8 in-process ranks and on real MPI and Gloo ranks."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import compcoll
from compcoll.kernels import reference
from compcoll.launcher import BACKENDS
from tests.pool import run
from tests.worlds import worlds

WORKERS = "tests.algorithms.onebit_workers"
SHAPES = [[1], [37], [3, 7, 11], [12289], [100003]]


@pytest.mark.parametrize("backend, world_size", worlds((1, 2, 3, 4, 5, 8), mpi=4, gloo=3))
def test_matches_reference_over_steps(backend: str, world_size: int) -> None:
    run(f"{WORKERS}:numerics", world_size, backend, args=(SHAPES, 3))


@pytest.mark.parametrize("backend, world_size", worlds((1, 2, 3, 4), mpi=3, gloo=2))
def test_levels_match_reference(backend: str, world_size: int) -> None:
    run(f"{WORKERS}:levels", world_size, backend, args=([[1], [37], [3, 7, 11], [4099]], 3))


@pytest.mark.parametrize("backend, world_size", worlds((1, 2, 3, 4), mpi=2, gloo=4))
def test_bad_inputs_raise_on_every_rank(backend: str, world_size: int) -> None:
    run(f"{WORKERS}:bad_inputs", world_size, backend)


@pytest.mark.parametrize("backend, world_size", worlds((2, 3, 4), mpi=3, gloo=2))
def test_in_place_and_stateful_resume(backend: str, world_size: int) -> None:
    """Thread ranks warn in this process: one warning a rank for the other world's state (processes' go to their
    stderr; tests/ddp checks them there)."""
    if backend != "threads":
        run(f"{WORKERS}:in_place_and_stateful", world_size, backend)
        return
    with pytest.warns(UserWarning, match="CompressedAllreduce: loaded the state of rank") as caught:
        run(f"{WORKERS}:in_place_and_stateful", world_size, backend)
    assert sum("CompressedAllreduce: loaded the state" in str(w.message) for w in caught) == world_size


@pytest.mark.parametrize("backend", BACKENDS)
def test_late_rank_times_out_instead_of_hanging(backend: str) -> None:
    run(f"{WORKERS}:late_rank", 3, backend, args=(3.0,), timeout=60, breaks=True)


@pytest.mark.parametrize("numel,world,expected", [(0, 1, 0), (1, 1, 8), (8, 1, 8), (9, 2, 16), (100, 3, 120)])
def test_padded_numel(numel: int, world: int, expected: int) -> None:
    assert compcoll.padded_numel(numel, world) == expected


def test_padded_numel_rejects_bad_arguments() -> None:
    with pytest.raises(ValueError, match="world_size >= 1"):
        compcoll.padded_numel(10, 0)


def test_single_rank_error_feedback_tracks_the_running_sum() -> None:
    """On one rank the sum of outputs stays within one step's error of the sum of inputs."""
    comm = compcoll.SingleComm()
    numel = 5003
    full = compcoll.padded_numel(numel, 1)
    we, se = torch.zeros(full), torch.zeros(full)
    gen = torch.Generator().manual_seed(5)
    total_in, total_out = torch.zeros(numel, dtype=torch.float64), torch.zeros(numel, dtype=torch.float64)
    for _ in range(200):
        x = torch.randn(numel, generator=gen)
        total_in += x
        total_out += compcoll.compressed_allreduce(x, we, se, comm).double()
    gap = (total_in - total_out).norm().item()
    expected_gap = (we[:numel].double() + se[:numel].double()).norm().item()
    assert gap == pytest.approx(expected_gap, rel=1e-3)
    assert gap < 0.05 * total_in.norm().item() * 200 ** 0.5


def test_empty_tensor() -> None:
    out = compcoll.compressed_allreduce(torch.empty(0), torch.zeros(0), torch.zeros(0), compcoll.SingleComm())
    assert out.shape == (0,)


def test_default_communicator_is_used() -> None:
    compcoll.set_default(compcoll.SingleComm())
    x = torch.randn(20)
    out = compcoll.compressed_allreduce(x, torch.zeros(24), torch.zeros(24))
    expected = reference.compressed_allreduce([x.numpy()], [np.zeros(24, np.float32)], [np.zeros(24, np.float32)])[0][0]
    assert np.array_equal(out.numpy(), expected)


def test_non_contiguous_input() -> None:
    x = torch.randn(30, 40).t()
    comm = compcoll.SingleComm()
    out = compcoll.compressed_allreduce(x, torch.zeros(1200), torch.zeros(1200), comm)
    ref = compcoll.compressed_allreduce(x.contiguous(), torch.zeros(1200), torch.zeros(1200), comm)
    assert out.shape == x.shape and torch.equal(out, ref)


@pytest.mark.parametrize("backend, world_size", worlds((1, 2, 3, 4, 5), mpi=3, gloo=2))
def test_block_scales_match_reference(backend: str, world_size: int) -> None:
    run(f"{WORKERS}:blockwise", world_size, backend, args=([[1], [37], [3, 7, 11], [12289]], 3))


@pytest.mark.parametrize("protocol, block_size, bits", [("gather_scatter", None, 1), ("allgather", None, 1),
                                                        ("gather_scatter", 64, 1), ("gather_scatter", 64, 4),
                                                        ("allgather", 64, 1)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("on_device", [False, True])
def test_the_device_part_of_a_call_neither_waits_nor_allocates(protocol: str, block_size: int | None, bits: int,
                                                               dtype: torch.dtype, on_device: bool) -> None:
    """What a CUDA graph would capture of a call (``FlatPlan.finish_flat`` / ``finish_blocks``, after the agreement)
    makes no host wait and, once the plan is warm, no device allocation: traced on meta tensors, whose counts are a
    GPU's (tests/bench/test_launches.py); with the agreement round on the host and on the device (NCCL's: the flat
    form's encode then reads the round's sums)."""
    from compcoll.algorithms.onebit import FlatPlan
    from compcoll.bench.launches import DeviceOps
    from compcoll.kernels.launch import COUNTS

    numel, meta = 100003, torch.device("meta")
    comm = compcoll.SingleComm()
    comm.agrees_on_device = on_device
    plan = FlatPlan(comm, numel, meta, protocol, 1, "l2", block_size, bits)
    x, out = torch.empty(numel, dtype=dtype, device=meta), torch.empty(numel, dtype=dtype, device=meta)
    we, se = torch.empty(plan.full, device=meta), torch.empty(plan.full, device=meta)
    if block_size is None:
        agree, finish = (lambda: plan.agree_flat(x, we)[1]), plan.finish_flat
    else:
        agree, finish = (lambda: plan.agree_blocks(x, we)), plan.finish_blocks
    finish(x, we, se, agree(), out)
    agreed = agree()
    COUNTS.reset()
    with DeviceOps() as ops:
        finish(x, we, se, agreed, out)
    assert (COUNTS.waits, ops.allocations) == (0, 0)
    assert COUNTS.launches >= 2
    if block_size is None:  # the weights, the table of sums, the senders and the divisor, or the weights and s_w
        assert len(agreed) == (6 if on_device else 2)
