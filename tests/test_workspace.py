"""Scratch buffers: the kernels' Temporaries, kept from one kernel call to the next, and a Workspace's parts."""

from __future__ import annotations

import threading

import torch

from compcoll import codecs
from compcoll.bench.launches import DeviceOps
from compcoll.kernels.launch import TRACED
from compcoll.workspace import Temporaries, Workspace


def _call(temporaries: Temporaries, requests: list[tuple[int, torch.dtype]]) -> list[torch.Tensor]:
    temporaries.start()
    return [temporaries.get(numel, dtype) for numel, dtype in requests]


def test_a_call_asking_in_the_same_order_gets_the_same_tensors_and_allocates_nothing():
    temporaries = Temporaries(torch.device("meta"))
    requests = [(1000, torch.float64), (1, torch.float64), (37, torch.float32)]
    first = _call(temporaries, requests)
    with DeviceOps() as ops:
        again = _call(temporaries, requests)
    assert ops.allocations == 0
    assert all(a is b for a, b in zip(again, first))
    assert [(t.numel(), t.dtype) for t in again] == requests


def test_one_call_gets_distinct_memory_for_each_request():
    temporaries = Temporaries(torch.device("cpu"))
    got = _call(temporaries, [(64, torch.float64), (64, torch.float64), (64, torch.float32), (64, torch.float32)])
    assert len({t.data_ptr() for t in got}) == 4


def test_a_larger_request_grows_the_buffer_and_a_smaller_one_cuts_it():
    temporaries = Temporaries(torch.device("cpu"))
    (small,) = _call(temporaries, [(10, torch.float64)])
    (large,) = _call(temporaries, [(1001, torch.float64)])
    assert large.numel() == 1001 and large.data_ptr() != small.data_ptr()
    (cut,) = _call(temporaries, [(7, torch.float64)])
    assert cut.numel() == 7 and cut.data_ptr() == large.data_ptr()


def test_a_steady_device_call_allocates_no_temporaries():
    """compensated_sum on meta tensors (the CUDA path's Python, ``TRACED``): its lane sums and total come from the
    thread's Temporaries from the second call on (two ``torch.empty`` a call before them)."""
    x, err = torch.empty(10_000, device="meta"), torch.empty(10_000, device="meta")
    codecs.compensated_sum(x, err)
    with DeviceOps() as ops:
        codecs.compensated_sum(x, err)
    assert ops.allocations == 0


def test_each_thread_and_stream_has_temporaries_of_its_own():
    device = torch.device("meta")
    seen = []

    def ask() -> None:
        empty = codecs.dispatch.temporaries(device, TRACED)
        seen.append(empty(16, "float64", TRACED).owner)

    threads = [threading.Thread(target=ask) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    ask()
    assert len({id(t) for t in seen}) == 3
    assert codecs.dispatch.temporaries(device, 0)(16, "float64", 0).owner is not seen[-1]


def test_a_workspaces_parts_are_views_of_its_buffer_kept_while_it_stands():
    """``Workspace.parts``: the buffer then its consecutive views, the same tensors call after call; new views of
    the new buffer once a larger request under the name has replaced it."""
    workspace, cpu = Workspace(), torch.device("cpu")
    whole, first, second = workspace.parts("scalars", (3, 1), torch.float32, cpu)
    whole.copy_(torch.arange(4.0))
    assert first.tolist() == [0.0, 1.0, 2.0] and second.tolist() == [3.0]
    assert all(a is b for a, b in zip(workspace.parts("scalars", (3, 1), torch.float32, cpu),
                                      (whole, first, second)))
    workspace.get("scalars", 9, torch.float32, cpu)
    grown = workspace.parts("scalars", (3, 1), torch.float32, cpu)
    assert grown[0] is not whole and grown[1].data_ptr() == grown[0].data_ptr()
    assert grown[2].data_ptr() == grown[0].data_ptr() + 3 * 4


def test_a_constant_is_made_once() -> None:
    """``Workspace.constant`` (a plan's senders): made at its first use, the same tensor after, whatever the values
    then passed (read only to make it)."""
    workspace = Workspace()
    first = workspace.constant("senders", range(3), torch.int32, torch.device("cpu"))
    assert first.tolist() == [0, 1, 2] and first.dtype == torch.int32
    assert workspace.constant("senders", [7], torch.int32, torch.device("cpu")) is first
