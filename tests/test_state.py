"""ErrorFeedbackState: buffers per key, checkpoint round trip, refusals."""

from __future__ import annotations

import io

import pytest
import torch

from compcoll import ErrorFeedbackState


def test_buffers_are_created_once_per_key() -> None:
    state = ErrorFeedbackState(rank=1, world_size=3)
    worker, server = state.get("w", torch.empty(100))
    assert worker.numel() == 120 and server.numel() == 40 and not worker.any()
    assert state.get("w", torch.empty(100))[0] is worker
    with pytest.raises(ValueError, match="use a new key"):
        state.get("w", torch.empty(500))


def test_round_trip_through_torch_save() -> None:
    state = ErrorFeedbackState(rank=0, world_size=2)
    state.get("a", torch.empty(10))[0].fill_(3.0)
    buffer = io.BytesIO()
    torch.save(state.state_dict(), buffer)
    buffer.seek(0)
    restored = ErrorFeedbackState(rank=0, world_size=2)
    restored.load_state_dict(torch.load(buffer))
    assert torch.equal(restored.get("a", torch.empty(10))[0], torch.full((16,), 3.0))


def test_other_rank_or_world_is_refused() -> None:
    saved = ErrorFeedbackState(rank=0, world_size=2).state_dict()
    with pytest.raises(ValueError, match="same world size"):
        ErrorFeedbackState(rank=1, world_size=2).load_state_dict(saved)
