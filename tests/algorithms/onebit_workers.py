"""Rank-side bodies of the multi-process compressed_allreduce tests (run by compcoll.launcher)."""

from __future__ import annotations

import io
import time
from typing import Callable

import numpy as np
import torch

import compcoll
from compcoll import spec
from compcoll.algorithms.agreement import Step, agree
from compcoll.algorithms.parts import unpacked
from compcoll.algorithms.pipeline import PIECES_FIELDS
from compcoll.algorithms.rounds import MESSAGE_BYTES, RECORD, summed
from compcoll.kernels import reference
from compcoll.spec import PROTOCOLS, SCALES
from tests.shared import world_once

DTYPES = (torch.float32, torch.float16, torch.bfloat16)
SCALE_NAMES = tuple(SCALES)


def make_input(rank: int, step: int, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """Fresh random input of one rank at one step; scales differ by rank; a few exact zeros."""
    gen = torch.Generator().manual_seed(1000003 * step + 7919 * rank + int(np.prod(shape)))
    x = torch.randn(shape, generator=gen) * (1.0 + rank) + 0.1 * step
    x.view(-1)[::97] = 0.0
    return x.to(dtype)


def world_inputs(comm: compcoll.Communicator, step: int, shape: tuple[int, ...],
                 dtype: torch.dtype) -> list[torch.Tensor]:
    """Every rank's ``make_input`` at ``step``, rank q's at index q: drawn once per in-process world
    (``world_once``), so the thread ranks share them and must not modify them."""
    return world_once(comm, _inputs, comm.size, step, tuple(shape), dtype)


def _inputs(n: int, step: int, shape: tuple[int, ...], dtype: torch.dtype) -> list[torch.Tensor]:
    return [make_input(q, step, shape, dtype) for q in range(n)]


def assert_same_on_all_ranks(comm: compcoll.Communicator, tensor: torch.Tensor, where: str = "") -> None:
    raw = tensor.detach().reshape(-1).view(torch.uint8).clone()
    table = torch.empty(comm.size * raw.numel(), dtype=torch.uint8)
    comm.allgather(raw, table)
    rows = table.view(comm.size, -1)
    differ = (rows != rows[0]).any(dim=1).nonzero().flatten().tolist()
    assert not differ, f"{where}rank {differ[0]}'s output differs from rank 0's"


def assert_matches_reference(out: torch.Tensor, expected: np.ndarray, where: str) -> None:
    """``out`` equals the reference's float32 result rounded to its dtype, bit for bit."""
    want = torch.from_numpy(expected).to(out.dtype).view(out.shape)
    assert torch.equal(out.view(torch.uint8), want.view(torch.uint8)), f"output ({where})"


def assert_errors_match(we: torch.Tensor, se: torch.Tensor, ref_we: np.ndarray, ref_se: np.ndarray, where: str) -> None:
    """Both error-feedback buffers equal the reference's exactly."""
    assert np.array_equal(we.numpy(), ref_we), f"worker error ({where})"
    assert np.array_equal(se.numpy(), ref_se), f"server error ({where})"


def numerics(comm: compcoll.Communicator, shapes: list[list[int]], steps: int) -> None:
    """Outputs, both error buffers and bytes sent equal the reference, step after step; the shapes take the
    scales in turn (both scales meet both protocols). A gather-scatter plan's first call also agrees on its pieces."""
    n, rank = comm.size, comm.rank
    plans: set[tuple[int, str, str]] = set()
    for dtype in DTYPES:
        for p, protocol in enumerate(PROTOCOLS):
            for i, shape in enumerate(map(tuple, shapes)):
                scale = SCALE_NAMES[(i + p) % 2]
                numel = int(np.prod(shape))
                full = compcoll.padded_numel(numel, n)
                we, se = torch.zeros(full), torch.zeros(full // n)
                ref_we = [np.zeros(full, np.float32) for _ in range(n)]
                ref_se = [np.zeros(full // n, np.float32) for _ in range(n)]
                for step in range(steps):
                    xs = world_inputs(comm, step, shape, dtype)
                    before, sent_before = xs[rank].clone(), comm.bytes_sent
                    out = compcoll.compressed_allreduce(xs[rank], we, se, comm, protocol=protocol, scale=scale)
                    sent = comm.bytes_sent - sent_before
                    flat = [x.float().reshape(-1).numpy() for x in xs]
                    outs, ref_we, ref_se, ref_sent = world_once(comm, reference.compressed_allreduce, flat, ref_we,
                                                                ref_se, protocol, scale)
                    where = f"{dtype} {protocol} {scale} shape {shape} step {step}"
                    assert torch.equal(xs[rank], before), f"input was modified ({where})"
                    assert out.shape == shape and out.dtype == dtype, where
                    assert_matches_reference(out, outs[rank], where)
                    assert_errors_match(we, se, ref_we[rank], ref_se[rank], where)
                    first = protocol == "gather_scatter" and (numel, protocol, scale) not in plans
                    plans.add((numel, protocol, scale))
                    setup = 8 * PIECES_FIELDS * (n - 1) if first else 0
                    assert sent == ref_sent[rank] + setup, f"bytes sent {sent} != {ref_sent[rank]} + {setup} ({where})"
                    assert_same_on_all_ranks(comm, out)


def steps_match_reference(comm: compcoll.Communicator, shape: tuple[int, ...], dtype: torch.dtype, steps: int,
                          asynchronous: Callable[[int], bool], options: dict, reference_options: dict) -> None:
    """``steps`` calls of ``compressed_allreduce(**options)`` on fresh inputs, from zero error buffers.

    At each step, blocking or (where ``asynchronous(step)``) through ``wait()``:
    1. The output has the input's shape and dtype and the reference's bits
       (``reference.compressed_allreduce(**reference_options)``, once per world: ``world_once``).
    2. Both error buffers equal the reference's, and the bytes sent its count.
    3. Every rank holds the same output.
    """
    n, rank = comm.size, comm.rank
    full = compcoll.padded_numel(int(np.prod(shape)), n)
    we, se = torch.zeros(full), torch.zeros(full // n)
    ref_we = [np.zeros(full, np.float32) for _ in range(n)]
    ref_se = [np.zeros(full // n, np.float32) for _ in range(n)]
    for step in range(steps):
        xs = world_inputs(comm, step, shape, dtype)
        sent_before = comm.bytes_sent
        out = compcoll.compressed_allreduce(xs[rank], we, se, comm, async_op=asynchronous(step), **options)
        out = out.wait() if asynchronous(step) else out
        sent = comm.bytes_sent - sent_before
        outs, ref_we, ref_se, ref_sent = world_once(comm, reference.compressed_allreduce,
                                                    [x.float().reshape(-1).numpy() for x in xs], ref_we, ref_se,
                                                    **reference_options)
        where = f"{dtype} {options} shape {shape} step {step}"
        assert out.shape == shape and out.dtype == dtype, where
        assert_matches_reference(out, outs[rank], where)
        assert_errors_match(we, se, ref_we[rank], ref_se[rank], where)
        assert sent == ref_sent[rank], f"bytes sent {sent} != {ref_sent[rank]} ({where})"
        assert_same_on_all_ranks(comm, out)


def in_place_and_stateful(comm: compcoll.Communicator) -> None:
    """out=tensor works in place; the stateful form resumes exactly from a saved state."""
    n = comm.size
    x = make_input(comm.rank, 0, (1001,), torch.float32)
    we, se = torch.zeros(compcoll.padded_numel(1001, n)), torch.zeros(compcoll.padded_numel(1001, n) // n)
    expected = compcoll.compressed_allreduce(x, we.clone(), se.clone(), comm)
    result = compcoll.compressed_allreduce(x, we, se, comm, out=x)
    assert result is x and torch.equal(x, expected)

    shapes = {"a": (333,), "b": (17, 5)}
    straight = compcoll.CompressedAllreduce(comm)
    resumed = compcoll.CompressedAllreduce(comm)
    for step in range(5):
        if step == 2:
            buffer = io.BytesIO()
            torch.save(resumed.state_dict(), buffer)
            buffer.seek(0)
            resumed = compcoll.CompressedAllreduce(comm)
            resumed.load_state_dict(torch.load(buffer))
        for key, shape in shapes.items():
            grad = make_input(comm.rank, step, shape, torch.float32)
            assert torch.equal(straight(grad, key), resumed(grad, key)), f"step {step} key {key}"
    state = resumed.state_dict()
    state["world_size"] = n + 1
    other = compcoll.CompressedAllreduce(comm, protocol="allgather")
    # with one warning a rank (counted on thread ranks by the test; on processes in tests/ddp: an elastic restart)
    assert other.load_state_dict(state) is False, "a checkpoint from another world size was taken as this rank's"
    assert not other.plans and other.protocol == "gather_scatter", "another world size's error buffers were loaded"


def _expect(exc_type: type, fragment: str, fn, *args, **kwargs) -> None:
    try:
        fn(*args, **kwargs)
    except exc_type as exc:
        assert fragment in str(exc), f"{exc_type.__name__} message {str(exc)!r} lacks {fragment!r}"
    else:
        raise AssertionError(f"expected {exc_type.__name__} ({fragment})")


def bad_inputs(comm: compcoll.Communicator) -> None:
    """Every bad input raises a clear error; collective ones on every rank; buffers stay put."""
    n, rank = comm.size, comm.rank
    numel = 1234
    full = compcoll.padded_numel(numel, n)
    x = make_input(rank, 0, (numel,), torch.float32)
    we = torch.randn(full, generator=torch.Generator().manual_seed(rank)) * 0.01
    se = torch.randn(full // n, generator=torch.Generator().manual_seed(99 + rank)) * 0.01
    car = compcoll.compressed_allreduce

    sent = comm.bytes_sent
    _expect(TypeError, "int32", car, x.to(torch.int32), we, se, comm)
    read_only = np.frombuffer(we.numpy().tobytes(), np.float32)
    _expect(TypeError, "worker_error must be a torch.Tensor or a writable array", car, x, read_only, se, comm)
    _expect(TypeError, "or an array that exports DLPack (numpy, cupy), got builtins.list", car, [1.0], we, se, comm)
    _expect(TypeError, "float64", car, x.double(), we, se, comm)
    _expect(TypeError, "worker_error must be float32", car, x, we.half(), se, comm)
    _expect(ValueError, f"{full} elements", car, x, we[:-8], se, comm)
    _expect(ValueError, f"{full // n} elements", car, x, we, torch.zeros(full // n + 8), comm)
    _expect(ValueError, "worker_error is on meta", car, x, torch.empty(full, device="meta"), se, comm)
    if not comm.carries_meta:
        _expect(ValueError, "on meta are not supported by this communicator", car, x.to("meta"), we.to("meta"),
                se.to("meta"), comm)
    _expect(ValueError, "protocol", car, x, we, se, comm, protocol="ring")
    _expect(ValueError, "scale 'linf' is not one of ('l2', 'l1')", car, x, we, se, comm, scale="linf")
    _expect(ValueError, "out must be", car, x, we, se, comm, out=torch.empty(numel + 1))
    _expect(ValueError, "tensor and worker_error share memory", car, we[:numel], we, se, comm)
    _expect(ValueError, "worker_error and server_error share memory", car, x, we, we[-(full // n):], comm)
    shifted = torch.randn(numel + 1)
    _expect(ValueError, "out overlaps tensor without being it", car, shifted[1:], we, se, comm, out=shifted[:-1])
    # a failed summed round: the allreduce and the values' all-gather (as a call's that agrees on a value) first
    summed_round = sum(spec.agreement_shares(n, rank, True)) if summed(comm) else 0
    refusal = summed_round + (n - 1) * (8 * RECORD + MESSAGE_BYTES)
    refused = 14 + (not comm.carries_meta)
    assert comm.bytes_sent - sent == refused * refusal, "a refused call sent more than its fixed-size rounds"
    if comm.carries_meta:
        assert car(x.to("meta"), we.to("meta"), se.to("meta"), comm).is_meta, "one rank or a thread world traces"

    saved = we.clone(), se.clone()

    def unchanged() -> None:
        assert torch.equal(we, saved[0]) and torch.equal(se, saved[1]), "an error buffer changed"

    other = numel + 100 * rank
    other_we = torch.zeros(compcoll.padded_numel(other, n))
    other_se = torch.zeros(other_we.numel() // n)
    if n > 1:
        _expect(compcoll.RankMismatchError, "sizes differ", car, make_input(rank, 0, (other,), torch.float32),
                other_we, other_se, comm)
        assert not other_we.any() and not other_se.any(), "an error buffer changed"
        shape = (2, numel // 2) if rank % 2 else (numel // 2, 2)
        _expect(compcoll.RankMismatchError, "shapes differ", car, x.view(shape), we, se, comm)
        unchanged()
        protocol = PROTOCOLS[rank % 2]
        _expect(compcoll.RankMismatchError, "different protocols", car, x, we, se, comm, protocol=protocol)
        unchanged()
        _expect(compcoll.RankMismatchError, "different scales", car, x, we, se, comm, scale=SCALE_NAMES[rank % 2])
        unchanged()
        _expect(compcoll.RankMismatchError, "different steps (rank 0: 5, rank 1: 6", agree, comm,
                "a step", x, True, (), (), Step(5 + rank))
        _expect(compcoll.RankMismatchError, f"at step 5 the settings of rank(s) {list(range(1, n))} differ", agree,
                comm, "a step", x, True, (), (), Step(5, rank))
        agree(comm, "a step", x, True, (), (), Step(5, 7))

    if n > 1:
        _one_bad_rank(comm, x, we, se)
        unchanged()

    poisoned = x.clone()
    if rank == n - 1:
        poisoned[numel // 2] = float("nan")
    _expect(compcoll.NonFiniteError, f"rank(s) [{n - 1}]", car, poisoned, we, se, comm)
    unchanged()
    bad_error = we.clone()
    if rank == 0:
        bad_error[-1] = float("inf")
    _expect(compcoll.NonFiniteError, "input or its worker error on rank(s) [0]", car, x, bad_error, se, comm)
    unchanged()
    half = x.half()
    if rank == 0:
        half[3] = float("inf")
    _expect(compcoll.NonFiniteError, "rank(s) [0]", car, half, we, se, comm)
    unchanged()

    xs = world_inputs(comm, 0, (numel,), torch.float32)
    ref_we = [torch.randn(full, generator=torch.Generator().manual_seed(q)).mul(0.01).numpy() for q in range(n)]
    ref_se = [torch.randn(full // n, generator=torch.Generator().manual_seed(99 + q)).mul(0.01).numpy()
              for q in range(n)]
    outs, ref_we, ref_se, _ = world_once(comm, reference.compressed_allreduce, [v.numpy() for v in xs], ref_we, ref_se)
    out = car(x, we, se, comm)
    assert torch.equal(out, torch.from_numpy(outs[rank])), "the communicator is not usable after the errors"
    assert np.array_equal(we.numpy(), ref_we[rank]) and np.array_equal(se.numpy(), ref_se[rank])


def _one_bad_rank(comm: compcoll.Communicator, x: torch.Tensor, we: torch.Tensor, se: torch.Tensor) -> None:
    """Only the last rank's arguments are bad: it raises its own error, every other rank ``RemoteError`` naming
    it and its message, at once (not after the 60 s timeout), blocking and asynchronous, for each entry point;
    the calls stay in step."""
    n, rank = comm.size, comm.rank
    bad, car = rank == n - 1, compcoll.compressed_allreduce
    timeout, comm.timeout = comm.timeout, 60.0
    named = f"rank(s) [{n - 1}] refused the call"
    start = time.monotonic()
    if bad:
        _expect(ValueError, f"{we.numel()} elements", car, x, we[:-8], se, comm)
        _expect(TypeError, "int32", car, x.to(torch.int32), we, se, comm, async_op=True)
        _expect(ValueError, "share memory", car, x, we, we[:se.numel()], comm)
    else:
        _expect(compcoll.RemoteError, f"{named} (rank {n - 1}: ValueError: compressed_allreduce: worker_error must",
                car, x, we, se, comm)
        _expect(compcoll.RemoteError, "TypeError", car(x, we, se, comm, async_op=True).wait)
        _expect(compcoll.RemoteError, "worker_error and server_error share memory", car, x, we, se, comm)
    stateful = compcoll.CompressedAllreduce(comm)
    stateful(x, key="w")
    if bad:
        _expect(ValueError, "use a new key", stateful, x[:100], key="w")
        _expect(ValueError, "step must be", compcoll.hierarchical_allreduce, x, comm, step=-1)
        _expect(TypeError, "server_error must be a torch.Tensor", compcoll.hierarchical_compressed_allreduce, x,
                we, None, comm, ranks_per_node=1)
    else:
        _expect(compcoll.RemoteError, "use a new key", stateful, x, key="w")
        _expect(compcoll.RemoteError, "step must be", compcoll.hierarchical_allreduce, x, comm)
        wn, sn = compcoll.hierarchical_error_numels(x.numel(), n, 1)
        _expect(compcoll.RemoteError, "server_error must be", compcoll.hierarchical_compressed_allreduce, x,
                torch.zeros(wn), torch.zeros(sn), comm, ranks_per_node=1)
    assert time.monotonic() - start < 30, "the ranks waited for a timeout instead of failing together"
    comm.timeout = timeout


def late_rank(comm: compcoll.Communicator, delay: float) -> None:
    """A rank that arrives after the timeout: the others raise CollectiveTimeout, not hang.

    The ranks start together (a barrier at the default timeout), and no rank leaves before the late one would have
    arrived: a rank that started late (a loaded machine) would otherwise find a peer gone ("Connection closed by
    peer") instead of its own timeout. The timeout is a sixth of ``delay``: on CI's two busy cores a timeout of a
    third (0.5 s of 1.5 s) once raised after the late rank's whole delay.
    """
    comm.barrier()
    comm.timeout = delay / 6
    numel = 100
    full = compcoll.padded_numel(numel, comm.size)
    we, se = torch.zeros(full), torch.zeros(full // comm.size)
    start = time.monotonic()
    if comm.rank == comm.size - 1:
        time.sleep(delay)
        return
    _expect(compcoll.CollectiveTimeout, "did not complete within", compcoll.compressed_allreduce,
            torch.randn(numel), we, se, comm)
    assert time.monotonic() - start < delay, "the timeout fired late"
    _expect(compcoll.CommunicatorBroken, "unusable", comm.barrier)
    time.sleep(max(0.0, delay - (time.monotonic() - start)))


def blockwise(comm: compcoll.Communicator, shapes: list[list[int]], steps: int) -> None:
    """One scale per block (``block_size``): outputs, both error buffers and bytes equal the reference's, step after
    step, for every dtype, both protocols, both scales and several block sizes; blocking and async; the stateful
    form resumes exactly; a NaN on one rank and ranks that disagree on the block size fail on every rank."""
    n, rank = comm.size, comm.rank
    sizes = (8, 64, 128, 1024)
    case = 0
    for dtype in DTYPES:
        for protocol in PROTOCOLS:
            for shape in map(tuple, shapes):
                case += 1
                options = dict(protocol=protocol, scale=SCALE_NAMES[case % 2], block_size=sizes[case % len(sizes)])
                steps_match_reference(comm, shape, dtype, steps, lambda step: step == 1, options, options)

    _resumes_exactly(comm, block_size=64)

    full = compcoll.padded_numel(1001, n)
    we, se = torch.ones(full), torch.ones(full // n)
    poisoned = make_input(rank, 0, (1001,), torch.float32)
    if rank == n - 1:
        poisoned[7] = float("nan")
    _expect(compcoll.NonFiniteError, f"rank(s) [{n - 1}]", compcoll.compressed_allreduce, poisoned, we, se, comm,
            block_size=64)
    assert bool((we == 1).all() and (se == 1).all()), "a NaN changed an error buffer"
    if n > 1:
        _expect(compcoll.RankMismatchError, "block sizes", compcoll.compressed_allreduce, poisoned.nan_to_num(),
                torch.zeros(full), torch.zeros(full // n), comm, block_size=64 if rank else 128)
    _expect(ValueError, "block_size must be None", compcoll.compressed_allreduce, poisoned, we, se, comm,
            block_size=100)
    _expect(ValueError, "runs in one piece", compcoll.compressed_allreduce, poisoned, we, se, comm, block_size=64,
            pieces=2)


def _resumes_exactly(comm: compcoll.Communicator, **options) -> torch.Tensor:
    """A ``CompressedAllreduce(**options)`` saved and loaded into a plain one at step 2 of 4 gives the uninterrupted
    one's bits at every step; returns the last input."""
    straight = compcoll.CompressedAllreduce(comm, **options)
    resumed = compcoll.CompressedAllreduce(comm, **options)
    for step in range(4):
        if step == 2:
            buffer = io.BytesIO()
            torch.save(resumed.state_dict(), buffer)
            buffer.seek(0)
            resumed = compcoll.CompressedAllreduce(comm)
            resumed.load_state_dict(torch.load(buffer))
        grad = make_input(comm.rank, step, (1001,), torch.float32)
        assert torch.equal(straight(grad, "g"), resumed(grad, "g")), f"resumed call {options}, step {step}"
    return grad


def levels(comm: compcoll.Communicator, shapes: list[list[int]], steps: int) -> None:
    """Gather-scatter with 2-8 bit levels: outputs, both error buffers and bytes equal the reference's, step after
    step, for every dtype and bits; the stateful form resumes exactly; a NaN on one rank fails on every rank."""
    n, rank = comm.size, comm.rank
    case = 0
    for dtype in DTYPES:
        for shape in map(tuple, shapes):
            case += 1
            options = dict(block_size=(8, 64, 256)[case % 3], bits=(2, 3, 4, 8)[case % 4])
            steps_match_reference(comm, shape, dtype, steps, lambda step: False, options,
                                  dict(protocol="gather_scatter", scale="l2", **options))

    grad = _resumes_exactly(comm, block_size=64, bits=3)
    full = compcoll.padded_numel(grad.numel(), n)
    _expect(ValueError, "needs protocol='gather_scatter' and a block_size", compcoll.compressed_allreduce,
            grad, torch.zeros(full), torch.zeros(full // n), comm, bits=3)
    if n > 1:
        full = compcoll.padded_numel(1001, n)
        we, se = torch.ones(full), torch.ones(full // n)
        poisoned = make_input(rank, 0, (1001,), torch.float32)
        if rank == n - 1:
            poisoned[5] = float("inf")
        _expect(compcoll.NonFiniteError, f"rank(s) [{n - 1}]", compcoll.compressed_allreduce, poisoned, we, se, comm,
                block_size=64, bits=4)
        assert bool((we == 1).all() and (se == 1).all()), "an error buffer changed"


def state_behind_calls(comm: compcoll.Communicator) -> None:
    """A ``CompressedAllreduce``'s ``state_dict`` taken while its asynchronous calls are in flight is the state
    after them (it waits its turn; it was copied before or half way through them), and a ``load_state_dict``
    issued during a call is not overwritten by it: the next call gives the bits of a run that loaded it with
    nothing in flight."""
    n = comm.size
    stateful = compcoll.CompressedAllreduce(comm)
    xs = [make_input(comm.rank, step, (1_000_003,), torch.float32) for step in range(4)]
    stateful(xs[0], key="w")
    works = [stateful(x, key="w", async_op=True) for x in xs[1:3]]
    during = unpacked(stateful.state_dict())
    for work in works:
        work.wait()
    after = stateful.state_dict()
    assert torch.equal(during["buffers"]["w"]["worker_error"], unpacked(after)["buffers"]["w"]["worker_error"]) and \
        torch.equal(during["buffers"]["w"]["server_error"], unpacked(after)["buffers"]["w"]["server_error"]), \
        f"rank {comm.rank} of {n}: a state_dict taken during the calls is not the state after them"
    expected = compcoll.CompressedAllreduce(comm)
    expected.load_state_dict(after)
    want = expected(xs[3], key="w")
    work = stateful(xs[0], key="w", async_op=True)
    stateful.load_state_dict(after)
    work.wait()
    assert torch.equal(stateful(xs[3], key="w"), want), "a load issued during a call was overwritten by it"
