"""Rank-side bodies of the uneven-input tests: torch's Join over real Gloo ranks."""

from __future__ import annotations

import torch
from torch.distributed.algorithms.join import Join

import compcoll
from compcoll.launcher import seeded
from compcoll.optim import OneBitAdam
from tests.algorithms.onebit_workers import assert_same_on_all_ranks
from tests.optim.optim_workers import batch, build, flat_params

STEPS = 8
"""The last rank's steps; rank r takes STEPS - 3 (size - 1 - r) of its own."""


def _own_steps(comm: compcoll.Communicator) -> int:
    return STEPS - 3 * (comm.size - 1 - comm.rank)


def _step(model: torch.nn.Module, opt: torch.optim.Optimizer, rank: int, step: int, zero: bool = False) -> None:
    opt.zero_grad()
    tokens, x, y = batch(rank, step)
    torch.nn.functional.cross_entropy(model(tokens, x), y).backward()
    if zero:
        for p in model.parameters():
            p.grad.zero_()
    opt.step()


def uneven_inputs_join(comm: compcoll.Communicator, name: str) -> None:
    """Ranks with 3 fewer batches each under ``Join([opt])``: every rank ends after the last rank's STEPS steps with
    the bits of a run where the ranks that ran out step on zero gradients (the joined rank's shadow steps), replicas
    identical; ``throw_on_early_termination=True`` raises on every rank instead."""
    model, opt = build(comm, name)
    with Join([opt]):
        for step in range(_own_steps(comm)):
            _step(model, opt, comm.rank, step)
    assert opt.steps + opt.skipped_steps == STEPS, (opt.steps, opt.skipped_steps)
    reference, ref_opt = build(comm, name)
    for step in range(STEPS):
        _step(reference, ref_opt, comm.rank, step, zero=step >= _own_steps(comm))
    if opt.synchronized:
        assert_same_on_all_ranks(comm, flat_params(model), f"{name} under Join: ")
    assert torch.equal(flat_params(model).view(torch.int32), flat_params(reference).view(torch.int32)), \
        f"{name}: the run under Join differs from zero-gradient steps"
    model, opt = build(comm, name)
    try:
        with Join([opt], throw_on_early_termination=True):
            for step in range(_own_steps(comm)):
                _step(model, opt, comm.rank, step)
    except RuntimeError as exc:
        assert "exhausted" in str(exc), exc
    else:
        raise AssertionError("no RuntimeError with throw_on_early_termination")


def two_optimizers_join(comm: compcoll.Communicator) -> None:
    """A GAN's two 1-bit Adams under one Join, listed in the order they step, one rank 3 batches short: both take
    the last rank's steps everywhere and the replicas end identical."""
    with seeded(0):
        gen = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 12))
        disc = torch.nn.Sequential(torch.nn.Linear(12, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
    opt_g, opt_d = (OneBitAdam(net.parameters(), freeze_step=2, comm=comm) for net in (gen, disc))
    draws = torch.Generator().manual_seed(comm.rank)
    with Join([opt_d, opt_g]):
        for _ in range(_own_steps(comm)):
            z, real = torch.randn(8, 8, generator=draws), torch.randn(8, 12, generator=draws)
            opt_d.zero_grad()
            (disc(real).mean() - disc(gen(z).detach()).mean()).backward()
            opt_d.step()
            opt_g.zero_grad()
            disc(gen(z)).mean().backward()
            opt_g.step()
    assert opt_g.steps == opt_d.steps == STEPS, (opt_g.steps, opt_d.steps)
    assert_same_on_all_ranks(comm, torch.cat([p.detach().reshape(-1) for net in (gen, disc)
                                              for p in net.parameters()]), "GAN under Join: ")
