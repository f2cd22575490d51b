"""Rank-side body of the chaos run: random per-rank faults, every rank's outcomes alike, nothing lost or corrupted."""

from __future__ import annotations

import time

import numpy as np
import torch

import compcoll
from compcoll.errors import NonFiniteError, RemoteError
from tests.algorithms.onebit_workers import assert_same_on_all_ranks, make_input
from tests.optim.optim_workers import batch, build, whole_state

FAULTS = ("none", "nan", "bad", "late")
WEIGHTS = (0.7, 0.1, 0.1, 0.1)
OK, SKIPPED, REFUSED = 0, 1, 2
NUMEL = 1237
STABLE = {name: dict(lr=1e-3, eps=1e-4) for name in ("OneBitAdam", "OneBitLamb", "ZeroOneAdam")}
"""Settings under which the optim tests' model trains for 500 steps without diverging (their lr 1e-2 blows up by
300)."""


def schedule(calls: int, size: int, seed: int) -> list[tuple[str, int, float]]:
    """(fault, faulty rank, delay) per call, drawn alike on every rank."""
    rng = np.random.default_rng(seed)
    kinds = rng.choice(len(FAULTS), calls, p=WEIGHTS)
    return [(FAULTS[k], int(r), float(d))
            for k, r, d in zip(kinds, rng.integers(0, size, calls), rng.uniform(0.001, 0.02, calls))]


def _outcome(call) -> int:
    """Run ``call``; OK, SKIPPED (NonFiniteError) or REFUSED (this rank's ValueError, or a peer's: RemoteError)."""
    try:
        return call()
    except NonFiniteError:
        return SKIPPED
    except RemoteError:
        return REFUSED
    except ValueError as exc:
        if isinstance(exc, compcoll.CompcollError):
            raise
        return REFUSED


def allreduce_series(comm: compcoll.Communicator, plan: list, faults: bool) -> tuple[list[int], list[torch.Tensor]]:
    """compressed_allreduce per call (every third asynchronous) into p -= out / 64; faulty calls skipped unless
    ``faults``.

    Returns the outcomes and (p, worker error, server error).
    """
    full = compcoll.padded_numel(NUMEL, comm.size)
    we, se, p = torch.zeros(full), torch.zeros(full // comm.size), torch.zeros(NUMEL)
    outcomes = []
    for i, (kind, rank, delay) in enumerate(plan):
        if not faults and kind in ("nan", "bad"):
            continue
        x = make_input(comm.rank, i, (NUMEL,), torch.float32)
        buffer = we
        if faults and rank == comm.rank:
            if kind == "nan":
                x[i % NUMEL] = float("nan")
            elif kind == "bad":
                buffer = torch.zeros(full + 8)
            elif kind == "late":
                time.sleep(delay)

        def call() -> int:
            if i % 3:
                out = compcoll.compressed_allreduce(x, buffer, se, comm)
            else:
                out = compcoll.compressed_allreduce(x, buffer, se, comm, async_op=True).wait()
            p.sub_(out / 64)
            return OK

        outcomes.append(_outcome(call))
    return outcomes, [p, we, se]


def optimizer_series(comm: compcoll.Communicator, name: str, plan: list, faults: bool) -> tuple[list[int], list]:
    """``name``'s steps on the optim tests' model; a fault is a NaN or a sparse gradient on one rank, or a late rank.

    Returns the outcomes and (this rank's parameters, every state buffer, the error buffers).
    """
    model, opt = build(comm, name, **STABLE.get(name, {}))
    outcomes = []
    for i, (kind, rank, delay) in enumerate(plan):
        if not faults and kind in ("nan", "bad"):
            continue
        opt.zero_grad()
        tokens, x, y = batch(comm.rank, i)
        torch.nn.functional.cross_entropy(model(tokens, x), y).backward()
        if faults and rank == comm.rank:
            if kind == "nan":
                model.hidden.weight.grad[0, 0] = float("nan")
            elif kind == "bad":
                model.out.bias.grad = model.out.bias.grad.to_sparse()
            elif kind == "late":
                time.sleep(delay)
        skipped = opt.skipped_steps

        def call() -> int:
            opt.step()
            return SKIPPED if opt.skipped_steps > skipped else OK

        outcomes.append(_outcome(call))
    state = whole_state(opt)
    errors = [v for v in (state["error_feedback"] or {}).values() if isinstance(v, torch.Tensor)]
    return outcomes, [opt.flat.data.clone(), *state["buffers"].values(), *errors, torch.tensor(opt.steps)]


def _expected(plan: list) -> list[int]:
    return [{"none": OK, "late": OK, "nan": SKIPPED, "bad": REFUSED}[kind] for kind, _, _ in plan]


def chaos(comm: compcoll.Communicator, calls: int, seed: int, configs: list[str]) -> None:
    """``calls`` calls of compressed_allreduce and of the steps of each optimizer in ``configs`` (names of
    ``CONFIGS``) with random per-rank faults.

    1. Every rank records each call's outcome (done, skipped for NaN, refused for a bad
       argument); the sequences are the schedule's and the same on every rank.
    2. A clean run, without the faulty calls, ends with the same bits: parameters,
       optimizer state, error buffers.
    """
    plan = schedule(calls, comm.size, seed)
    want = _expected(plan)
    series = [("compressed_allreduce", lambda faults: allreduce_series(comm, plan, faults))]
    series += [(name, lambda faults, name=name: optimizer_series(comm, name, plan, faults)) for name in configs]
    for what, run_series in series:
        outcomes, final = run_series(True)
        if outcomes != want:
            at = next(i for i, (got, expect) in enumerate(zip(outcomes, want)) if got != expect)
            raise AssertionError(f"{what}: call {at} ({plan[at]}) ended {outcomes[at]}, expected {want[at]}")
        assert_same_on_all_ranks(comm, torch.tensor(outcomes, dtype=torch.int64))
        clean_outcomes, clean = run_series(False)
        assert all(o == OK for o in clean_outcomes), f"{what}: the clean run had a fault"
        assert len(final) == len(clean)
        for index, (got, expect) in enumerate(zip(final, clean)):
            assert torch.equal(got.reshape(-1).view(torch.uint8), expect.reshape(-1).view(torch.uint8)), \
                f"{what}: final state tensor {index} differs from the clean run's"
