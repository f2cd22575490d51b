"""Rank-side bodies of the torch.compile tests: compiled training steps around compcoll's optimizers."""

from __future__ import annotations

import torch

import compcoll
from compcoll.algorithms.reduce_scatter import compressed_reduce_scatter, row_elements
from tests.algorithms.onebit_workers import assert_same_on_all_ranks
from tests.optim.optim_workers import STEPS, batch, build, flat_params


def compiled_step_equals_eager(comm: compcoll.Communicator, name: str) -> None:
    """A training step compiled whole (forward, backward and ``opt.step()``: Dynamo breaks its graph at the step,
    which runs as Python) and ``torch.compile(opt.step)`` alone end with the bits of the eager run; the replicas stay
    identical. (Dynamo traced into the step and failed inside numba.) Dynamo's "eager" backend: the model's own
    arithmetic is unchanged, so the bits can be compared."""
    def train_step(model, opt, step: int) -> torch.Tensor:
        opt.zero_grad()
        tokens, x, y = batch(comm.rank, step)
        loss = torch.nn.functional.cross_entropy(model(tokens, x), y)
        loss.backward()
        opt.step()
        return loss

    runs = {}
    for how in ("eager", "compiled step", "compiled opt.step"):
        model, opt = build(comm, name)
        if how == "compiled opt.step":
            opt.step = torch.compile(opt.step, backend="eager")
        run = torch.compile(train_step, backend="eager") if how == "compiled step" else train_step
        for step in range(STEPS):
            run(model, opt, step)
        if hasattr(opt, "synchronize"):
            opt.synchronize()
        assert opt.steps == STEPS, (how, opt.steps)
        runs[how] = flat_params(model)
        assert_same_on_all_ranks(comm, runs[how])
    for how in ("compiled step", "compiled opt.step"):
        assert torch.equal(runs[how].view(torch.int32), runs["eager"].view(torch.int32)), f"{name}: {how} differs"


def compiled_calls_equal_eager(comm: compcoll.Communicator) -> None:
    """Each public collective inside a compiled function (torch ops around it; Dynamo breaks its graph at the call)
    gives the eager call's bits, its error buffers too; an asynchronous call waited on inside the function as well.
    (Dynamo traced into the call and, on one rank, failed on a view of the wire frames.)"""
    n, rows = comm.size, 3
    x = torch.randn(1001, generator=torch.Generator().manual_seed(comm.rank))
    full = compcoll.padded_numel(x.numel(), n)
    hierarchical = compcoll.hierarchical_error_numels(x.numel(), n, compcoll.topology(comm).ranks_per_node)
    shard = row_elements(rows * n, n)
    allreduce = {"eager": compcoll.CompressedAllreduce(comm), "compiled": compcoll.CompressedAllreduce(comm)}
    calls = {
        "compressed_allreduce": (
            lambda e: compcoll.compressed_allreduce(x * 2, e[0], e[1], comm) + 1, (full, full // n)),
        "async compressed_allreduce": (
            lambda e: compcoll.compressed_allreduce(x * 2, e[0], e[1], comm, async_op=True).wait() + 1,
            (full, full // n)),
        "hierarchical_compressed_allreduce": (
            lambda e: compcoll.hierarchical_compressed_allreduce(x * 2, e[0], e[1], comm) + 1, hierarchical),
        "hierarchical_allreduce": (lambda e: compcoll.hierarchical_allreduce(x * 2, comm, seed=3, step=0) + 1, ()),
        "compressed_reduce_scatter": (
            lambda e: compressed_reduce_scatter(x[:rows * n] * 2, torch.empty(rows), e[0], comm) + 1, (n * shard,)),
    }
    for name, (call, numels) in calls.items():
        done = {}
        for how in ("eager", "compiled"):
            errors = [torch.zeros(k) for k in numels]
            run = torch.compile(call, backend="eager") if how == "compiled" else call
            done[how] = [run(errors) for _ in range(3)], errors
        for (eager_out, compiled_out) in zip(*(done[how][0] for how in done)):
            assert torch.equal(eager_out, compiled_out), f"{name}: the compiled call's result differs"
        assert all(map(torch.equal, done["eager"][1], done["compiled"][1])), f"{name}: error buffers differ"
    for how, kept in allreduce.items():
        call = (lambda: kept(x * 2, key="x") + 1)
        allreduce[how] = [(torch.compile(call, backend="eager") if how == "compiled" else call)() for _ in range(3)]
    assert all(map(torch.equal, allreduce["eager"], allreduce["compiled"])), "CompressedAllreduce differs compiled"
