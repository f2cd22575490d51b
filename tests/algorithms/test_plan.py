"""Plans on one rank: error feedback per key, checkpoint round trips, refusals, the bounded plan cache."""

from __future__ import annotations

import io

import numpy as np
import pytest
import torch

from compcoll import CompressedAllreduce, ErrorFeedback, SingleComm, compressed_allreduce, padded_numel
from compcoll.algorithms.plan import MAX_CACHED_PLANS, cached_plans


def test_a_key_keeps_one_plan_and_its_buffers() -> None:
    allreduce = CompressedAllreduce(SingleComm())
    allreduce(torch.randn(100), key="w")
    plan = allreduce.plans["w"]
    worker = plan.error_feedback.worker_error
    assert worker.numel() == padded_numel(100, 1)
    allreduce(torch.randn(10, 10), key="w")
    assert allreduce.plans["w"] is plan and plan.error_feedback.worker_error is worker
    with pytest.raises(ValueError, match="use a new key"):
        allreduce(torch.randn(500), key="w")


def test_a_keys_buffers_follow_its_tensor_to_another_device() -> None:
    """A key whose buffers are on another device than the call's tensor (loaded from ``compcoll.checkpoint``'s files,
    which map to the CPU, on a GPU run) moves them there and calls on; it raised ValueError before 2026-12-01. The
    other device a CPU-only torch has is meta (``tests/gpu``: on CUDA, with the bits of the run that went on)."""
    allreduce = CompressedAllreduce(SingleComm())
    allreduce(torch.randn(100), key="w")
    plan = allreduce.plans["w"]
    out = allreduce(torch.empty(100, device="meta"), key="w")
    assert out.device.type == "meta" and allreduce.plans["w"] is plan and plan.device.type == "meta"
    assert {buffer.device.type for buffer in plan.error_feedback.buffers()} == {"meta"}


def test_round_trip_through_torch_save() -> None:
    allreduce = CompressedAllreduce(SingleComm())
    x = torch.randn(37)
    allreduce(x, key="a")
    saved = io.BytesIO()
    torch.save(allreduce.state_dict(), saved)
    saved.seek(0)
    restored = CompressedAllreduce(SingleComm())
    restored.load_state_dict(torch.load(saved))
    assert torch.equal(restored.plans["a"].error_feedback.worker_error,
                       allreduce.plans["a"].error_feedback.worker_error)
    assert torch.equal(restored(x, key="a"), allreduce(x, key="a"))


def test_other_rank_or_world_is_refused() -> None:
    saved = ErrorFeedback(0, 2, 10, (16, 0), (8, 0), torch.device("cpu")).state_dict()
    with pytest.raises(ValueError, match="same world size"):
        ErrorFeedback(1, 2, 10, (16, 0), (8, 8), torch.device("cpu")).load_state_dict(saved)
    with pytest.raises(ValueError, match="shape"):
        ErrorFeedback(0, 2, 10, (32, 0), (8, 0), torch.device("cpu")).load_state_dict(saved)


def test_forget_clears_the_coordinates_each_buffer_covers() -> None:
    feedback = ErrorFeedback(1, 2, 12, (16, 0), (8, 8), torch.device("cpu"))
    feedback.worker_error.fill_(1.0)
    feedback.server_error.fill_(2.0)
    mask = torch.zeros(12, dtype=torch.bool)
    mask[[0, 9, 11]] = True
    feedback.forget(mask)
    assert feedback.worker_error.nonzero().flatten().tolist() == [i for i in range(16) if i not in (0, 9, 11)]
    assert feedback.server_error.tolist() == [2.0, 0.0, 2.0, 0.0] + [2.0] * 4


def test_functional_calls_keep_a_bounded_number_of_plans() -> None:
    comm = SingleComm()
    for numel in range(1, MAX_CACHED_PLANS + 20):
        full = padded_numel(numel, 1)
        compressed_allreduce(torch.randn(numel), torch.zeros(full), torch.zeros(full), comm)
    assert cached_plans(comm) == MAX_CACHED_PLANS


def test_objects_that_give_no_dlpack_view_are_refused_saying_what_works() -> None:
    """A cupy-like object without DLPack, a list, a read-only error buffer: a TypeError naming what is accepted."""
    cupy_like = type("ndarray", (), {"__module__": "cupy._core.core"})
    for array, name in ((cupy_like(), "cupy._core.core.ndarray"), ([0.0] * 8, "builtins.list")):
        with pytest.raises(TypeError, match=f"torch.Tensor or an array that exports DLPack .numpy, cupy., got {name}"):
            compressed_allreduce(array, torch.zeros(8), torch.zeros(8), SingleComm())
    read_only = np.frombuffer(np.zeros(8, np.float32).tobytes(), np.float32)
    with pytest.raises(TypeError, match="server_error must be a torch.Tensor or a writable array"):
        compressed_allreduce(np.ones(8, np.float32), torch.zeros(8), read_only, SingleComm())
