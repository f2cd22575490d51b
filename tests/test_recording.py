"""The thread's recording of device work: what voids it, what a collective adds, and that it ends with its call."""

from __future__ import annotations

import pytest
import torch

from compcoll.recording import CALL_TENSORS, NO_CONTEXT, Recording, current, record


def test_keyed_memory_is_the_call_tensors_bytes() -> None:
    """Addresses in a call tensor's 64 bytes are its; an empty view may start just past them."""
    a = torch.zeros(16)
    recording, p = Recording((torch.zeros(3), a)), a.data_ptr()
    assert [recording.keyed_index(x) for x in (p - 1, p, p + 63, p + 64)] == [None, 1, 1, None]
    assert recording.keyed_index(p + 64, empty=True) == 1


def test_the_guard_voids_at_an_operator_that_allocates_or_returns_a_new_tensor_and_passes_views() -> None:
    x = torch.zeros(8)
    viewed = Recording()
    record(viewed, lambda: x.view(2, 4)[1].detach().reshape(-1))
    assert viewed.void is None and viewed.steps == []
    for work, name in ((lambda: x.add(1.0), "aten.add.Tensor"), (lambda: torch.empty(3), "aten.empty"),
                       (lambda: x.clone(), "aten.clone")):
        voided = Recording()
        record(voided, work)
        assert name in voided.void


def test_an_operator_in_place_is_a_step_run_on_the_next_calls_tensors() -> None:
    """``out.view(2, 4)[1, 1:3].copy_(src)`` with ``out`` a call tensor and ``src`` a buffer of the plan's: replayed
    on another call's ``out`` (its views made from it), ``src`` read as kept; a view of another element size of a
    call tensor voids."""
    out, src = torch.zeros(8), torch.tensor([1.0, 2.0])
    recording = Recording((out,))
    record(recording, lambda: out.view(2, 4)[1, 1:3].copy_(src))
    assert recording.void is None and out.tolist() == [0, 0, 0, 0, 0, 1, 2, 0]
    ((run, args, context),) = recording.steps
    assert context == CALL_TENSORS and recording.signature[0][0] is torch.ops.aten.copy_.default
    other = torch.full((8,), 9.0)
    src.mul_(10)
    run([other], *args)
    assert other.tolist() == [9, 9, 9, 9, 9, 10, 20, 9] and out.tolist() == [0, 0, 0, 0, 0, 1, 2, 0]
    halves = torch.zeros(4, dtype=torch.bfloat16)
    recording = Recording((out, halves))
    record(recording, lambda: out.view(torch.int16)[:2].zero_())
    assert "another element size" in recording.void


def test_operators_with_call_tensors_as_keywords_or_in_lists_replay_on_the_next_calls_tensors() -> None:
    """A call tensor as a keyword argument (``torch.sum``'s ``out``) and inside a list argument (``torch.cat``'s
    tensors: the nested way) is made anew from the next call's tensors."""
    x, total, joined = torch.tensor([1.0, 2.0]), torch.zeros(1, dtype=torch.float64), torch.zeros(4)
    kept = torch.tensor([5.0, 6.0])
    recording = Recording((x, total, joined))
    record(recording, lambda: (torch.sum(x.view(1, -1), 1, dtype=torch.float64, out=total),
                               torch.cat([kept, x], out=joined)))
    assert recording.void is None and total.item() == 3.0 and joined.tolist() == [5, 6, 1, 2]
    other = (torch.tensor([10.0, 20.0]), torch.zeros(1, dtype=torch.float64), torch.zeros(4))
    for run, args, context in recording.steps:
        assert context == CALL_TENSORS
        run(list(other), *args)
    assert other[1].item() == 30.0 and other[2].tolist() == [5, 6, 10, 20]
    assert total.item() == 3.0 and joined.tolist() == [5, 6, 1, 2]


def test_a_collective_is_a_step_and_its_own_operators_are_its_part() -> None:
    recording, x = Recording(), torch.zeros(4)

    def issue(tensor: torch.Tensor, async_op: bool) -> str:
        tensor.add_(1.0)
        return "done"

    assert record(recording, lambda: recording.collective(issue, x, False)) == "done"
    assert recording.void is None and recording.steps == [(issue, (x, False), NO_CONTEXT)]
    record(recording, lambda: recording.collective(issue, x, True))
    assert recording.void == "an asynchronous collective"


def test_the_recording_is_the_threads_only_during_its_call() -> None:
    recording = Recording()
    seen = []
    record(recording, lambda: seen.append(current()))
    assert seen == [recording] and current() is None
    with pytest.raises(RuntimeError):
        record(recording, lambda: (_ for _ in ()).throw(RuntimeError("part failed")))
    assert current() is None
    recording.refuse("first")
    recording.refuse("second")
    assert recording.void == "first"
