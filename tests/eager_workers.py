"""Rank-side bodies of the torch.compile tests: compiled training steps around compcoll's optimizers."""

from __future__ import annotations

import torch

import compcoll
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
