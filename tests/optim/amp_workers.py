"""Rank-side bodies of the mixed-precision tests: GradScaler overflows on one rank, 16-bit parameters."""

from __future__ import annotations

import io
import warnings

import torch

import compcoll
from compcoll.launcher import seeded
from compcoll.optim import GradScaler
from tests.algorithms.onebit_workers import assert_same_on_all_ranks
from tests.optim.optim_workers import CONFIGS, STEPS, Net, batch, build

OVERFLOW_STEP = 6


def _scales(comm: compcoll.Communicator, scaler: torch.amp.GradScaler) -> list[float]:
    table = torch.empty(comm.size, dtype=torch.float64)
    comm.allgather(torch.tensor([scaler.get_scale()], dtype=torch.float64), table)
    return table.tolist()


def _train_scaled(comm: compcoll.Communicator, name: str, scaler: torch.amp.GradScaler | None,
                  overflow: bool) -> tuple[torch.Tensor, object, list]:
    """STEPS steps through ``scaler`` (None: unscaled); with ``overflow`` the last rank's gradient gets an Inf once."""
    model, opt = build(comm, name)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for step in range(STEPS):
            opt.zero_grad()
            tokens, x, y = batch(comm.rank, step)
            loss = torch.nn.functional.cross_entropy(model(tokens, x), y)
            (loss if scaler is None else scaler.scale(loss)).backward()
            if overflow and step == OVERFLOW_STEP and comm.rank == comm.size - 1:
                model.hidden.weight.grad[0, 0] = float("inf")
            if scaler is None:
                opt.step()
            else:
                scaler.step(opt)
                scaler.update()
            if opt.synchronized:
                assert_same_on_all_ranks(comm, opt.flat.data)
    return opt.flat.data.clone(), opt, [w for w in caught if "loss scale" in str(w.message)]


def grad_scaler(comm: compcoll.Communicator, name: str) -> None:
    """Loss scaling with each optimizer: exact unscaling, one rank's overflow skipped on every rank.

    1. Without overflow, steps through a scaler end with the bits of unscaled steps
       (scaling by powers of two is exact).
    2. torch.amp.GradScaler, an Inf on the last rank at one step: every rank skips that
       step (no hang), replicas stay identical; the last rank's loss scale backs off
       alone, and the other ranks warn that it now differs.
    3. compcoll.optim.GradScaler: the same skip, and the loss scales stay equal.
    """
    plain, _, _ = _train_scaled(comm, name, None, False)
    scaled, _, _ = _train_scaled(comm, name, GradScaler("cpu", init_scale=1024.0, growth_interval=4), False)
    assert torch.equal(plain.view(torch.int32), scaled.view(torch.int32)), "a scaled run differs from the unscaled"
    for kind in (torch.amp.GradScaler, GradScaler):
        scaler = kind("cpu", init_scale=1024.0, growth_interval=4)
        _, opt, warned = _train_scaled(comm, name, scaler, True)
        assert (opt.steps, opt.skipped_steps) == (STEPS - 1, 1), (kind.__name__, opt.steps, opt.skipped_steps)
        scales = _scales(comm, scaler)
        last = comm.size - 1
        if kind is GradScaler or comm.size == 1:
            assert len(set(scales)) == 1, f"{kind.__name__}: loss scales differ: {scales}"
            assert not warned
        else:
            assert scales[last] < scales[0] and len(set(scales[:last])) == 1, scales
            assert bool(warned) == (comm.rank != last), f"rank {comm.rank}: warnings {warned}"


def half_parameters(comm: compcoll.Communicator, name: str, dtype_name: str, at: int) -> None:
    """A model in float16 / bfloat16: float32 master weights, rounded into the model after each step.

    Replicas stay identical, the state is float32, the model holds the master rounded
    to nearest, the master carries bits the model cannot, and a checkpoint at ``at``
    resumed in PyTorch's usual order (model, then optimizer built, then its state)
    ends with the uninterrupted run's bits.
    """
    dtype = getattr(torch, dtype_name)
    cls, kwargs = CONFIGS[name]

    def fresh() -> tuple[torch.nn.Module, object]:
        with seeded(100 + comm.rank):
            model = Net().to(dtype)
        return model, cls(model.parameters(), comm=comm, **kwargs)

    def train(model, opt, steps: range) -> None:
        for step in steps:
            opt.zero_grad()
            tokens, x, y = batch(comm.rank, step)
            torch.nn.functional.cross_entropy(model(tokens, x.to(dtype)).float(), y).backward()
            opt.step()
            rounded = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
            assert torch.equal(rounded.view(torch.int16), opt.flat.data.to(dtype).view(torch.int16)), step
            if opt.synchronized:
                assert_same_on_all_ranks(comm, opt.flat.data)

    model, opt = fresh()
    train(model, opt, range(at))
    saved = io.BytesIO()
    torch.save({"model": model.state_dict(), "optimizer": opt.state_dict()}, saved)
    train(model, opt, range(at, STEPS))
    assert all(buf.dtype in (torch.float32, torch.float64, torch.bool) for buf in opt._buffers.values())
    master = opt.flat.data
    assert not torch.equal(master, master.to(dtype).float()), "the master weights hold no more than the model"

    loaded = torch.load(io.BytesIO(saved.getvalue()), weights_only=True)
    with seeded(999):
        model2 = Net().to(dtype)
    model2.load_state_dict(loaded["model"])
    opt2 = cls(model2.parameters(), comm=comm, **kwargs)
    opt2.load_state_dict(loaded["optimizer"])
    train(model2, opt2, range(at, STEPS))
    assert torch.equal(opt2.flat.data.view(torch.int32), master.view(torch.int32)), "resume differs"
