"""The thread's recording of device work: what voids it, what a collective adds, and that it ends with its call."""

from __future__ import annotations

import pytest
import torch

from compcoll.recording import NO_CONTEXT, Recording, current, record


def test_keyed_memory_is_the_call_tensors_bytes() -> None:
    recording = Recording(((100, 164), (300, 300)))
    assert [recording.keyed_memory(a) for a in (99, 100, 163, 164, 300)] == [False, True, True, False, False]


def test_the_guard_voids_at_an_operator_that_computes_or_allocates_and_passes_views() -> None:
    x = torch.zeros(8)
    viewed = Recording(())
    record(viewed, lambda: x.view(2, 4)[1].detach().reshape(-1))
    assert viewed.void is None and viewed.steps == []
    for work, name in ((lambda: x.add_(1.0), "aten.add_"), (lambda: torch.empty(3), "aten.empty"),
                       (lambda: x.clone(), "aten.clone")):
        voided = Recording(())
        record(voided, work)
        assert name in voided.void


def test_a_collective_is_a_step_and_its_own_operators_are_its_part() -> None:
    recording, x = Recording(()), torch.zeros(4)

    def issue(tensor: torch.Tensor, async_op: bool) -> str:
        tensor.add_(1.0)
        return "done"

    assert record(recording, lambda: recording.collective(issue, x, False)) == "done"
    assert recording.void is None and recording.steps == [(issue, (x, False), NO_CONTEXT)]
    record(recording, lambda: recording.collective(issue, x, True))
    assert recording.void == "an asynchronous collective"


def test_the_recording_is_the_threads_only_during_its_call() -> None:
    recording = Recording(())
    seen = []
    record(recording, lambda: seen.append(current()))
    assert seen == [recording] and current() is None
    with pytest.raises(RuntimeError):
        record(recording, lambda: (_ for _ in ()).throw(RuntimeError("part failed")))
    assert current() is None
    recording.refuse("first")
    recording.refuse("second")
    assert recording.void == "first"
