"""Replays of plans' device parts: when a call replays, what it launches, what voids a recording.

The bits: on CPU tensors through the CUDA path under numba's simulator, ``tests/kernels/test_cuda_path.py``'s
"replay" part, and on a GPU, ``tests/gpu``.
"""

from __future__ import annotations

import pytest
import torch

import compcoll
from compcoll.algorithms import replay
from compcoll.algorithms.replay import KEPT, Replays
from compcoll.bench.launches import PROTOCOLS, protocol_calls
from compcoll.kernels.launch import COUNTS, TRACED, read_first

META = torch.device("meta")


@pytest.fixture
def replays_on():
    """Replays on for the test (whatever ``COMPCOLL_REPLAY`` said), as they were after."""
    was = replay.enabled()
    replay.enable(True)
    yield
    replay.enable(was)


def _plan(comm: compcoll.Communicator):
    (plan,) = comm.attached["plans"].values()
    return plan


def test_a_steady_call_replays_from_its_fourth_call_and_launches_and_waits_the_same(replays_on) -> None:
    """Each protocol of ``bench.launches.PROTOCOLS`` on meta tensors: the counts of every call from the second are
    the same, the second and third recording and the later ones replaying where the form replays."""
    calls = protocol_calls(torch.empty(4097, device=META), compcoll.SingleComm())
    for name in PROTOCOLS:
        counts = []
        for _ in range(5):
            COUNTS.reset()
            calls[name]()
            counts.append((COUNTS.launches, COUNTS.wraps, COUNTS.waits))
        assert counts[1] == counts[2] == counts[3] == counts[4], (name, counts)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("options", [{}, {"protocol": "allgather"}, {"block_size": 64}, {"block_size": 64, "bits": 4}])
def test_every_form_replays(replays_on, options: dict, dtype: torch.dtype) -> None:
    """One scale, block scales and levels (whose device part divides in place with torch), into float32 and into a
    16-bit output (the allgather protocol's a torch copy of its float32 average). ``SingleComm``'s rounds run on the
    device, where the flat gather-scatter form with one scale replays from the fifth call: its first, in pieces not
    yet agreed, takes the host's scalars (``tests/algorithms/replay_workers.py``)."""
    comm, x = compcoll.SingleComm(), torch.empty(1000, dtype=dtype, device=META)
    we, se, out = torch.zeros(1000, device=META), torch.zeros(1000, device=META), torch.empty_like(x)
    for _ in range(5):
        assert compcoll.compressed_allreduce(x, we, se, comm, out=out, **options) is out
    counts = _plan(comm).replays.counts
    parts = ("sum", "finish_flat") if "block_size" not in options else ("statistics", "finish_blocks")
    assert counts == {part: 2 - (options == {} and part == "finish_flat") for part in parts}, counts


@pytest.mark.parametrize("ranks_per_node", [1, None])
def test_birder_replays_with_each_calls_own_seed_and_step(replays_on, ranks_per_node: int | None) -> None:
    """Birder's seed and step reach its kernels through device memory (``codecs.stream_keys``), so calls that each
    draw other random streams still replay, from the fourth; ``step=None`` takes the communicator's count."""
    comm, x = compcoll.SingleComm(), torch.empty(1000, device=META)
    out = torch.empty_like(x)
    for call in range(6):
        step = None if call % 2 else 7 * call
        compcoll.hierarchical_allreduce(x, comm, ranks_per_node=ranks_per_node, seed=call, step=step, out=out)
    assert _plan(comm).replays.counts == {"maxima": 3, "finish": 3}


def test_replays_off_run_every_call(replays_on) -> None:
    replay.enable(False)
    comm, x = compcoll.SingleComm(), torch.empty(1000, device=META)
    we, se = torch.zeros(1000, device=META), torch.zeros(1000, device=META)
    for _ in range(5):
        compcoll.compressed_allreduce(x, we, se, comm)
    assert _plan(comm).replays.replayed == 0


def test_cpu_tensors_are_never_recorded(replays_on) -> None:
    comm, x = compcoll.SingleComm(), torch.randn(1000)
    we, se, out = torch.zeros(1000), torch.zeros(1000), torch.empty(1000)
    for _ in range(5):
        compcoll.compressed_allreduce(x, we, se, comm, out=out)
    replays = _plan(comm).replays
    assert replays.replayed == 0 and not replays._recorded


def _launches(out: torch.Tensor, count: list[int], scale: float = 1.0) -> torch.Tensor:
    """A device part of one counted launch of meta tensors (through ``codecs``, its scale a host value), returning
    ``out``."""
    count[0] += 1
    compcoll.codecs.compensate_encode(None, out, scale, _BITS[:out.numel() // 8])
    return out


_BITS = torch.empty(1024, dtype=torch.uint8, device=META)


@pytest.mark.parametrize("extra, why", [(lambda out: out.add(1.0), "the torch operator aten.add.Tensor"),
                                        (lambda out: read_first(None, TRACED), "a value read to the host"),
                                        (lambda out: compcoll.SingleComm().barrier(async_op=True),
                                         "an asynchronous collective"),
                                        (lambda out: out.view(2, -1)[0].detach(), None),
                                        (lambda out: out.view(2, -1)[1].add_(1.0), None)])
def test_a_recording_is_void_where_its_part_does_more_than_launch_and_communicate(replays_on, extra, why) -> None:
    """A part that computes a new tensor with torch, reads a value back or starts an asynchronous collective runs its
    Python at every call; views and detaches are nothing to replay, and an operator in place is a step."""
    replays, out, ran = Replays(), torch.empty(64, device=META), [0]

    def part(out: torch.Tensor) -> torch.Tensor:
        extra(out)
        return _launches(out, ran)

    for _ in range(5):
        assert replays.run("part", part, out) is out
    ((recording, returned),) = replays._recorded.values()
    assert recording.void is None if why is None else why in recording.void
    assert (ran[0], replays.replayed) == ((3, 2) if why is None else (5, 0))
    if why is None:
        assert returned == 0 and len(recording.steps) in (1, 2)


def test_a_part_that_returns_a_new_tensor_is_not_replayed(replays_on) -> None:
    replays, out = Replays(), torch.empty(64, device=META)
    for _ in range(5):
        replays.run("part", lambda out: _launches(out, [0]).view(-1), out)
    assert replays.replayed == 0 and "not one of its arguments" in next(iter(replays._recorded.values()))[0].void


def test_each_key_records_apart_and_the_least_recently_used_goes(replays_on) -> None:
    """Another output is another key, recorded at its own second and third calls; past ``KEPT`` keys the oldest is
    dropped."""
    replays, ran = Replays(), [0]
    outs = [torch.empty(64 + i, device=META) for i in range(KEPT + 1)]
    for out in outs[:2] * 4:
        replays.run("part", lambda out: _launches(out, ran), out)
    assert (ran[0], replays.replayed) == (6, 2)
    for out in outs[2:] * 3:
        replays.run("part", lambda out: _launches(out, ran), out)
    assert len(replays._recorded) == KEPT
    before = ran[0]
    replays.run("part", lambda out: _launches(out, ran), outs[0])
    assert ran[0] == before + 1


def test_launches_that_differ_from_one_call_to_the_next_are_not_replayed(replays_on) -> None:
    """A host value in a launch (here the scale) that changes from call to call, as a seed or a step would: the two
    recordings differ, and every call runs its Python; the same value every call replays."""
    for scales, replayed in (([1.0, 2.0, 3.0, 4.0, 5.0], 0), ([2.0] * 5, 2)):
        replays, out, ran = Replays(), torch.empty(64, device=META), [0]
        for scale in scales:
            replays.run("part", lambda out: _launches(out, ran, scale), out)
        assert (ran[0], replays.replayed) == (5 - replayed, replayed)
        if not replayed:
            assert "differ from one call to the next" in next(iter(replays._recorded.values()))[0].void


def test_a_recording_replays_only_on_the_thread_that_made_it(replays_on) -> None:
    """Its launches use that thread's kernel temporaries: another thread's calls on the same tensors record their
    own (three calls run their Python) before they replay."""
    import threading

    replays, out, ran = Replays(), torch.empty(64, device=META), [0]
    for _ in range(4):
        replays.run("part", lambda out: _launches(out, ran), out)
    other = threading.Thread(target=lambda: [replays.run("part", lambda out: _launches(out, ran), out)
                                             for _ in range(4)])
    other.start()
    other.join()
    assert (ran[0], replays.replayed) == (6, 2)
