"""A state's own part packed under its process's key, unpacked back; states of the layout before it load as they are."""

from __future__ import annotations

import pytest
import torch

from compcoll import CompressedAllreduce, SingleComm
from compcoll.algorithms.parts import packed, unpacked


def test_a_part_packs_under_its_process_and_unpacks_back_on_the_cpu() -> None:
    errors = {"w": torch.randn(13)}
    state = {"world_size": 4, "rank": 1, "job": [5, 8], "errors": errors, "bits": 3}
    saved = packed(state, ("rank", "errors"))
    assert set(saved) == {"world_size", "bits", "job_size", "rank5"} and isinstance(saved["rank5"], bytes)
    assert saved["job_size"] == 8
    back = unpacked(saved)
    assert set(back) == set(state) and back["job"] == [5, 8] and back["rank"] == 1 and back["bits"] == 3
    assert torch.equal(back["errors"]["w"], errors["w"]) and back["errors"]["w"].device.type == "cpu"


def test_a_state_of_the_earlier_layout_is_taken_as_it_is_and_two_parts_are_refused() -> None:
    earlier = {"world_size": 2, "rank": 0, "errors": {}}
    assert unpacked(earlier) is earlier
    two = {**packed({"job": [0, 2], "errors": {}}, ("errors",)), **packed({"job": [1, 2], "errors": {}}, ("errors",))}
    with pytest.raises(ValueError, match="the own parts of 2 processes .*rank0, rank1"):
        unpacked(two)


def test_an_allreduce_state_of_the_earlier_layout_still_loads() -> None:
    """A ``CompressedAllreduce`` state saved before 2026-12-01 (its buffers and rank among its entries, no job) loads
    its buffers: the next call has the bits of the allreduce that saved it."""
    allreduce = CompressedAllreduce(SingleComm())
    x = torch.randn(37)
    allreduce(x, key="a")
    earlier = {key: value for key, value in unpacked(allreduce.state_dict()).items() if key != "job"}
    restored = CompressedAllreduce(SingleComm())
    assert restored.load_state_dict(earlier) is True
    assert torch.equal(restored(x, key="a"), allreduce(x, key="a"))
