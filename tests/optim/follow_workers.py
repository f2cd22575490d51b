"""Rank-side bodies of the tests that frameworks may move, assign, load or cast the parameters under an optimizer."""

from __future__ import annotations

from typing import Callable

import torch

import compcoll
from compcoll.launcher import seeded
from tests.algorithms.onebit_workers import assert_same_on_all_ranks
from tests.optim.optim_workers import CONFIGS, Net, _tensors, whole_state

STEPS = 12
"""Through every optimizer's warmup into its compressed phase (0/1 Adam: local steps and a sync)."""
NAMES = ["OneBitAdam", "OneBitLamb", "OneBitLamb layers", "ZeroOneAdam", "Birder"]


def _loaded(model: torch.nn.Module) -> None:
    """Load other weights in place, as ``model.load_state_dict`` after a checkpoint (the same on every rank)."""
    with seeded(777):
        other = Net()
    model.load_state_dict({k: v * 0.5 for k, v in other.state_dict().items()})


def _assigned(model: torch.nn.Module) -> None:
    for p in model.parameters():
        p.data = p.data.clone()


CHANGES: dict[str, Callable[[torch.nn.Module, str], object]] = {
    "to": lambda model, device: model.to(device),
    "param.data": lambda model, device: _assigned(model),
    "edited through param.data": lambda model, device: [p.data.mul_(0.5) for p in model.parameters()],
    "load_state_dict": lambda model, device: _loaded(model),
    "half": lambda model, device: model.half(),
    "bfloat16": lambda model, device: model.bfloat16(),
}
"""What frameworks do to a model after its optimizer exists, each given the device ``to`` moves to."""
SIXTEEN_BIT_TOO = ("param.data", "load_state_dict")
"""Changes also tried on a bfloat16 model, whose parameters are roundings of their float32 masters."""


TOLERANCE = {torch.float32: dict(rtol=1e-5, atol=1e-6), torch.bfloat16: dict(rtol=1.6e-2, atol=1e-5),
             torch.float16: dict(rtol=2e-3, atol=1e-5)}
"""CUDA against CPU for the optimizers' torch arithmetic, whose kernels round differently (fused multiply-adds):
far above rounding (two units in the last place of each dtype), far below a wrong update (lr 1e-2)."""


def close(a: torch.Tensor, b: torch.Tensor, where: str) -> float:
    """Assert ``a`` and ``b`` (any devices) are within ``TOLERANCE`` of ``a``'s dtype; returns the largest
    absolute difference."""
    a, b = a.detach().cpu(), b.detach().cpu()
    torch.testing.assert_close(a.float(), b.float(), **TOLERANCE.get(a.dtype, TOLERANCE[torch.float32]),
                               msg=lambda m: f"{where}: {m}")
    return float((a.float() - b.float()).abs().max()) if a.numel() else 0.0


def _step(comm: compcoll.Communicator, model: torch.nn.Module, opt, step: int) -> None:
    """One step on seeded gradients of this rank (an embedding row and an input column always zero)."""
    gen = torch.Generator().manual_seed(1000 * comm.rank + step)
    for p in model.parameters():
        grad = torch.randn(p.shape, generator=gen)
        if p is model.emb.weight:
            grad[10:] = 0.0
        p.grad = grad.to(p.dtype).to(p.device)
    opt.step()


def _run(comm: compcoll.Communicator, name: str, change: str, start: str, device: str, at: int | None,
         dtype: torch.dtype = torch.float32) -> tuple[torch.nn.Module, object]:
    """A model on ``start``, its optimizer, STEPS steps; ``change`` the model at step ``at`` (-1: before building;
    None: never)."""
    with seeded(100 + comm.rank):
        model = Net().to(dtype).to(start)
    cls, kwargs = CONFIGS[name]
    if at == -1:
        CHANGES[change](model, device)
    opt = cls(model.parameters(), comm=comm, **kwargs)
    for step in range(STEPS):
        if step == at:
            CHANGES[change](model, device)
        _step(comm, model, opt, step)
    return model, opt


def _unchanged(comm: compcoll.Communicator, name: str, start: str, dtype: torch.dtype,
               runs: dict[tuple[str, torch.dtype], tuple[torch.nn.Module, object]]) -> tuple[torch.nn.Module, object]:
    """The run whose model is never changed (the same whatever the change), computed once per optimizer and dtype
    into ``runs``; callers only read it."""
    if (name, dtype) not in runs:
        runs[name, dtype] = _run(comm, name, "to", start, start, None, dtype)
    return runs[name, dtype]


def _same(a: tuple[torch.nn.Module, object], b: tuple[torch.nn.Module, object], where: str,
          exact: bool = True) -> None:
    """Both runs' parameters (bits, dtypes), master weights and every state and error buffer are equal (not
    ``exact``: within ``TOLERANCE``, for runs that took steps on different kinds of device)."""
    (model_a, opt_a), (model_b, opt_b) = a, b

    def same(x: torch.Tensor, y: torch.Tensor, what: str) -> None:
        if exact:
            assert torch.equal(x.detach().cpu().view(torch.uint8), y.detach().cpu().view(torch.uint8)), \
                f"{where}: {what} differs"
        else:
            close(x, y, f"{where}: {what}")

    for (key, p), q in zip(model_a.named_parameters(), model_b.parameters()):
        assert p.dtype == q.dtype, f"{where}: {key} is {p.dtype}, not {q.dtype}"
        same(p, q, f"parameter {key}")
    state_a, state_b = whole_state(opt_a), whole_state(opt_b)
    same(opt_a.flat.data, opt_b.flat.data, "master weights")
    for key, buf in state_a["buffers"].items():
        same(buf, state_b["buffers"][key], f"state buffer {key}")
    errors_a, errors_b = state_a["error_feedback"], state_b["error_feedback"]
    if errors_a is not None:
        for x, y in zip(_tensors(errors_a), _tensors(errors_b)):
            same(x, y, "error buffers")
    assert state_a["scalars"] == state_b["scalars"] and state_a["steps"] == state_b["steps"] == STEPS, where


def built_then_changed(comm: compcoll.Communicator, start: str, device: str, changes: list[str]) -> None:
    """Every optimizer, every change: changed after building equals changed before building, bit for bit.

    The model starts on ``start``; ``to`` moves it to ``device``. Where the move stays on
    one kind of device, also ``moved_mid_run``.
    """
    unchanged: dict[tuple[str, torch.dtype], tuple[torch.nn.Module, object]] = {}
    for name in NAMES:
        for change in changes:
            for dtype in (torch.float32, torch.bfloat16) if change in SIXTEEN_BIT_TOO else (torch.float32,):
                where = f"{name}, {change} of {dtype} ({start} -> {device}) on rank {comm.rank} of {comm.size}"
                after = _run(comm, name, change, start, device, 0, dtype)
                _same(after, _run(comm, name, change, start, device, -1, dtype), f"{where}: built then changed")
                assert_same_on_all_ranks(comm, after[1].flat.data.cpu())
                if change in ("load_state_dict", "half", "bfloat16", "edited through param.data"):
                    never = _unchanged(comm, name, start, dtype, unchanged)
                    assert not torch.equal(after[1].flat.data.cpu(), never[1].flat.data.cpu()), \
                        f"{where}: the change made no difference, so the test shows nothing"
    if "to" in changes and torch.device(start).type == torch.device(device).type:
        moved_mid_run(comm, start, device, unchanged)


def moved_mid_run(comm: compcoll.Communicator, start: str, device: str,
                  unchanged: dict[tuple[str, torch.dtype], tuple[torch.nn.Module, object]] | None = None) -> None:
    """Every optimizer, float32 and bfloat16: moved from ``start`` to ``device`` in the middle of training equals
    never moved (the state follows; 16-bit parameters keep their float32 masters). The never-moved runs are
    ``unchanged``'s where ``built_then_changed`` already made them.

    On one kind of device, bit for bit. Across kinds (CPU <-> CUDA), within ``TOLERANCE``: the optimizers'
    element-wise steps are torch's, whose CUDA and CPU kernels round differently.
    """
    exact = torch.device(start).type == torch.device(device).type
    unchanged = {} if unchanged is None else unchanged
    for name in NAMES:
        for dtype in (torch.float32, torch.bfloat16):
            moved = _run(comm, name, "to", start, device, STEPS // 2, dtype)
            _same(moved, _unchanged(comm, name, start, dtype, unchanged),
                  f"{name} {dtype} moved {start} -> {device} mid-run", exact)
            assert moved[1].flat.device.type == torch.device(device).type
            assert all(p.device.type == torch.device(device).type for p in moved[0].parameters())


UNFOLLOWABLE = {
    "shape": "changed shape from (3,) to (4,)",
    "groups": "no longer hold",
    "freeze": "parameter 4 (shape (3,)) was trained when the optimizer was built and is frozen now",
    "unfreeze": "parameter 0 (shape (20, 4)) was frozen when the optimizer was built and is trained now",
}
"""Each change a built optimizer cannot follow, and what the changing rank's error says."""


def unfollowable_changes_raise_everywhere(comm: compcoll.Communicator, change: str) -> None:
    """A parameter that changes shape, groups that no longer hold the built parameters, a trained parameter frozen
    or a frozen one unfrozen (``UNFOLLOWABLE``), on the last rank: that rank raises ValueError naming it, the others
    RemoteError, at that step, and nothing changed."""
    with seeded(100 + comm.rank):
        model = Net()
    if change == "unfreeze":
        model.emb.weight.requires_grad_(False)
    opt = CONFIGS["OneBitAdam"][0](model.parameters(), comm=comm, **CONFIGS["OneBitAdam"][1])
    _step(comm, model, opt, 0)
    if comm.rank == comm.size - 1:
        if change == "shape":
            model.out.bias.data = torch.zeros(4)
        elif change == "groups":
            opt.param_groups[0]["params"][-1] = torch.nn.Parameter(torch.zeros(3))
        else:
            (model.emb.weight if change == "unfreeze" else model.out.bias).requires_grad_(change == "unfreeze")
    before = opt.flat.data.clone()
    try:
        _step(comm, model, opt, 1)
    except compcoll.RemoteError as exc:
        assert comm.rank != comm.size - 1 and UNFOLLOWABLE[change] in str(exc), exc
    except ValueError as exc:
        assert comm.rank == comm.size - 1 and UNFOLLOWABLE[change] in str(exc), exc
    else:
        raise AssertionError(f"no error on rank {comm.rank}")
    assert torch.equal(opt.flat.data, before) and opt.steps == 1


def frozen_equals_left_out(comm: compcoll.Communicator) -> None:
    """Every optimizer with weight decay, over a model with frozen parameters (requires_grad=False, no gradient):
    built over all its parameters equals built over the trained ones alone, bit for bit (parameters, master
    weights, every state and error buffer), as torch's optimizers skip a parameter without a gradient; the frozen
    ones keep their bits."""
    for name in NAMES:
        runs = []
        for leave_out in (False, True):
            with seeded(100 + comm.rank):
                model = Net()
            model.hidden.requires_grad_(False)
            frozen = [p.detach().clone() for p in model.hidden.parameters()]
            cls, kwargs = CONFIGS[name]
            params = [p for p in model.parameters() if p.requires_grad or not leave_out]
            opt = cls(params, comm=comm, **dict(kwargs, weight_decay=0.1))
            for step in range(STEPS):
                gen = torch.Generator().manual_seed(1000 * comm.rank + step)
                for p in model.parameters():
                    p.grad = torch.randn(p.shape, generator=gen) if p.requires_grad else None
                opt.step()
            for p, before in zip(model.hidden.parameters(), frozen):
                assert torch.equal(p.detach(), before), f"{name}: a frozen parameter changed (leave_out={leave_out})"
            runs.append((model, opt))
        _same(runs[0], runs[1], f"{name} with frozen parameters on rank {comm.rank} of {comm.size}")
        assert_same_on_all_ranks(comm, runs[0][1].flat.data)


def zero_one_adam_takes_weights_loaded_in_its_local_phase(comm: compcoll.Communicator) -> None:
    """0/1 Adam in its local phase, at a synchronisation (its replicas agree): weights loaded then (the same on every
    rank, 10 away from the trained ones) are where its next steps start, on every rank alike. Before 2026-11-30 its
    next synchronisation rebuilt the parameters from those of the last one, undoing the load."""
    with seeded(100 + comm.rank):
        model = Net()
    cls, kwargs = CONFIGS["ZeroOneAdam"]
    opt = cls(model.parameters(), comm=comm, **kwargs)
    step = 0
    while step <= kwargs["var_freeze_step"] or not opt.synchronized:
        _step(comm, model, opt, step)
        step += 1
    loaded = {key: value + 10.0 for key, value in model.state_dict().items()}
    model.load_state_dict(loaded)
    for _ in range(3):
        _step(comm, model, opt, step)
        step += 1
    assert opt.synchronized, "the schedule should end on a synchronisation"
    moved = max(float((p.detach() - loaded[key]).abs().max()) for key, p in model.named_parameters())
    assert moved < 1.0, f"3 steps after the load the parameters are {moved:.3f} from the loaded weights"
    assert_same_on_all_ranks(comm, opt.flat.data)
