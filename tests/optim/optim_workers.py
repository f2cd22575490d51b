"""Rank-side bodies of the multi-process optimizer tests (run by compcoll.launcher)."""

from __future__ import annotations

import io
import math
from typing import Any, Callable

import numpy as np
import torch

import compcoll
from compcoll.kernels import reference
from compcoll.launcher import seeded
from compcoll.optim import Birder, OneBitAdam, OneBitLamb, ZeroOneAdam
from compcoll.optim.saved import inner_state
from compcoll.spec import protocol_for
from tests.algorithms.onebit_workers import assert_same_on_all_ranks

STEPS = 16
UNUSED_ROWS = slice(10, 20)
ZERO_INPUT = 4 + 1

CONFIGS = {
    "OneBitAdam": (OneBitAdam, dict(lr=1e-2, freeze_step=4)),
    "OneBitLamb": (OneBitLamb, dict(lr=1e-2, freeze_step=4)),
    "OneBitLamb layers": (OneBitLamb, dict(lr=1e-2, freeze_step=4, layer_scales=True)),
    "ZeroOneAdam": (ZeroOneAdam, dict(lr=1e-2, var_freeze_step=6, var_update_scaler=2, local_step_scaler=3,
                                      local_step_clipper=4)),
    "Birder": (Birder, dict(lr=1e-3)),
    "OneBitAdam bc": (OneBitAdam, dict(lr=1e-2, freeze_step=4, bias_correction=True)),
    "ZeroOneAdam bc": (ZeroOneAdam, dict(lr=1e-2, var_freeze_step=6, var_update_scaler=2, local_step_scaler=3,
                                         local_step_clipper=4, bias_correction=True)),
}


class Net(torch.nn.Module):
    """An embedding of which rows 10-19 are never used, and an MLP whose input 5 is always zero."""

    def __init__(self, hidden: int = 5) -> None:
        super().__init__()
        self.emb = torch.nn.Embedding(20, 4)
        self.hidden = torch.nn.Linear(7, hidden)
        self.out = torch.nn.Linear(hidden, 3)

    def forward(self, tokens: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        return self.out(torch.relu(self.hidden(torch.cat([self.emb(tokens), x], dim=1))))


def batch(rank: int, step: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Fresh data of one rank at one step: tokens 0-9 only, input column 1 always zero."""
    gen = torch.Generator().manual_seed(7919 * rank + 104729 * step + 1)
    tokens = torch.randint(0, 10, (8,), generator=gen)
    x = torch.randn(8, 3, generator=gen) * (1 + rank)
    x[:, 1] = 0.0
    return tokens, x, torch.randint(0, 3, (8,), generator=gen)


def build(comm: compcoll.Communicator, name: str, **overrides):
    """A model initialised differently on every rank (the optimizer broadcasts rank 0's) and its optimizer."""
    with seeded(100 + comm.rank):
        model = Net()
    cls, kwargs = CONFIGS[name]
    return model, cls(model.parameters(), comm=comm, **{**kwargs, **overrides})


def train(comm, model, opt, steps: range, poison: int | None = None) -> None:
    """Run ``steps`` on this rank's batches; at step ``poison`` the last rank's gradient gets a NaN."""
    for step in steps:
        opt.zero_grad()
        tokens, x, y = batch(comm.rank, step)
        torch.nn.functional.cross_entropy(model(tokens, x), y).backward()
        if step == poison and comm.rank == comm.size - 1:
            model.hidden.weight.grad[0, 0] = float("nan")
        opt.step()
        if getattr(opt, "synchronized", True):
            assert_same_on_all_ranks(comm, opt.flat.data)


def flat_params(model: torch.nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


def replicas(comm: compcoll.Communicator, name: str) -> None:
    """Replicas start from rank 0's weights, stay bit-identical, train, and never move unused coordinates."""
    model, opt = build(comm, name)
    start = flat_params(model).clone()
    assert_same_on_all_ranks(comm, start)
    train(comm, model, opt, range(STEPS))
    assert getattr(opt, "synchronized", True), "the test's schedule should end on a synchronisation"
    assert_same_on_all_ranks(comm, opt.flat.data)
    assert opt.steps == STEPS and opt.skipped_steps == 0
    assert not torch.equal(flat_params(model), start), "nothing trained"
    initial = Net()
    torch.nn.utils.vector_to_parameters(start, initial.parameters())
    assert torch.equal(model.emb.weight[UNUSED_ROWS], initial.emb.weight[UNUSED_ROWS]), \
        "embedding rows that never had a gradient moved"
    assert torch.equal(model.hidden.weight[:, ZERO_INPUT], initial.hidden.weight[:, ZERO_INPUT]), \
        "weights of an always-zero input moved"
    assert not torch.equal(model.emb.weight[:10], initial.emb.weight[:10]), "used embedding rows did not train"


def _checkpoint(model, opt) -> bytes:
    buffer = io.BytesIO()
    torch.save({"model": model.state_dict(), "optimizer": opt.state_dict()}, buffer)
    return buffer.getvalue()


def resume(comm: compcoll.Communicator, name: str, at: int) -> None:
    """A run resumed from a torch.save checkpoint at step ``at`` ends bit-identical to the uninterrupted run.

    Both orders: the optimizer built first and both states loaded after it, and
    PyTorch's usual order (the model's weights loaded, then the optimizer built, which
    broadcasts rank 0's parameters, then its state loaded).
    """
    model, opt = build(comm, name)
    train(comm, model, opt, range(at))
    saved = _checkpoint(model, opt)
    train(comm, model, opt, range(at, STEPS))
    cls, kwargs = CONFIGS[name]
    for order in ("optimizer first", "model first"):
        loaded = torch.load(io.BytesIO(saved), weights_only=True)
        if order == "optimizer first":
            model2, opt2 = build(comm, name)
            model2.load_state_dict(loaded["model"])
        else:
            with seeded(12345 + comm.rank):
                model2 = Net()
            model2.load_state_dict(loaded["model"])
            opt2 = cls(model2.parameters(), comm=comm, **kwargs)
        opt2.load_state_dict(loaded["optimizer"])
        assert opt2.steps == at
        train(comm, model2, opt2, range(at, STEPS))
        assert torch.equal(flat_params(model2).view(torch.int32), flat_params(model).view(torch.int32)), \
            f"resumed at step {at} ({order}), the parameters differ from the uninterrupted run's"
        for key, value in whole_state(opt)["buffers"].items():
            assert torch.equal(value, whole_state(opt2)["buffers"][key]), \
                f"state buffer {key} differs ({order})"


def nonfinite(comm: compcoll.Communicator, name: str, at: int, policy: str) -> None:
    """A NaN gradient on the last rank at step ``at``: every rank skips (or raises) alike, nothing changes."""
    model, opt = build(comm, name, nonfinite=policy)
    train(comm, model, opt, range(at))
    before_params = opt.flat.data.clone()
    before_state = whole_state(opt)
    if policy == "raise":
        try:
            train(comm, model, opt, range(at, at + 1), poison=at)
        except compcoll.NonFiniteError as exc:
            assert "NaN or Inf" in str(exc)
        else:
            raise AssertionError("no NonFiniteError")
    else:
        train(comm, model, opt, range(at, at + 1), poison=at)
        assert opt.skipped_steps == 1
    assert torch.equal(opt.flat.data, before_params), "a skipped step changed the parameters"
    after_state = whole_state(opt)
    assert after_state["steps"] == at
    for key, value in before_state["buffers"].items():
        assert torch.equal(value, after_state["buffers"][key]), f"a skipped step changed {key}"
    before_errors, after_errors = _tensors(before_state["error_feedback"]), _tensors(after_state["error_feedback"])
    assert len(before_errors) == len(after_errors)
    for before, after in zip(before_errors, after_errors):
        assert torch.equal(before, after), "a skipped step changed an error buffer"
    train(comm, model, opt, range(at + 1, STEPS))
    assert opt.steps == STEPS - 1


def whole_state(opt: compcoll.optim.CompressedOptimizer, state: dict | None = None) -> dict:
    """``opt``'s state (or ``state``, one of its ``state_dict()``s) with its buffers whole: counters, scalars, flat
    buffers, error feedback and parameters (``compcoll.optim.saved.inner_state``)."""
    state = opt.state_dict() if state is None else state
    return inner_state(state, opt.flat, opt.comm.rank, opt.comm.size, type(opt).__name__)


def _tensors(state) -> list[torch.Tensor]:
    """Every tensor in a nested state (dicts and lists), in order."""
    if isinstance(state, torch.Tensor):
        return [state]
    if isinstance(state, dict):
        return [t for key in sorted(state) for t in _tensors(state[key])]
    if isinstance(state, list):
        return [t for item in state for t in _tensors(item)]
    return []


def layout_mismatch(comm: compcoll.Communicator, name: str) -> None:
    """Ranks whose models differ get RankMismatchError at construction, on every rank."""
    model = Net(hidden=5 if comm.rank == 0 else 6)
    cls, kwargs = CONFIGS[name]
    try:
        cls(model.parameters(), comm=comm, **kwargs)
    except compcoll.RankMismatchError as exc:
        assert "differ across ranks" in str(exc)
    else:
        raise AssertionError("no RankMismatchError")


OPTION_CHOICES = {"compress": ("update", "momentum"), "protocol": ("gather_scatter", "allgather"),
                  "variance_refresh": (0, 8), "layer_scales": (False, True), "bias_correction": (False, True),
                  "nonfinite": ("skip", "raise"), "freeze_step": (4, 5), "local_step_clipper": (4, 2),
                  "hierarchical": (None, False), "seed": (0, 1), "factor_max": (4.0, 2.0),
                  "lr": (1e-2, 2e-2), "weight_decay": (0.0, 0.01)}
"""Per option an optimizer's ranks must agree on: rank 0's value and the others'."""
GROUPS = ("lr", "weight_decay")
"""The options that are the groups' hyperparameters; the others are the optimizers' settings."""


def option_mismatch(comm: compcoll.Communicator, name: str, option: str) -> None:
    """Ranks that choose ``option`` differently get RankMismatchError at construction, naming it, its values and
    the ranks that hold each."""
    cls, kwargs = CONFIGS[name]
    first, other = OPTION_CHOICES[option]
    try:
        cls(Net().parameters(), comm=comm, **{**kwargs, option: other if comm.rank else first})
    except compcoll.RankMismatchError as exc:
        what, key = (("hyperparameters of the parameter groups", f"{option} of group 0") if option in GROUPS
                     else ("settings", option))
        others = ", ".join(map(str, range(1, comm.size)))
        expected = f"{cls.__name__}: ranks asked for different {what} ({key}: {first!r} on rank(s) [0], {other!r} on "
        assert expected + f"rank(s) [{others}])" in str(exc), exc
    else:
        raise AssertionError("no RankMismatchError")


def refused_construction(comm: compcoll.Communicator, name: str, option: str, bad: Any) -> None:
    """Rank 1 alone builds the optimizer with a bad ``option`` (``"params"``: float64 parameters): it raises its own
    error, the others RemoteError naming it and its message, at once, not after a timeout."""
    cls, kwargs = CONFIGS[name]
    net = Net()
    if comm.rank == 1 and option == "params":
        net = net.double()
    arguments = {**kwargs, **({option: bad} if comm.rank == 1 and option != "params" else {})}
    try:
        cls(net.parameters(), comm=comm, **arguments)
    except compcoll.RemoteError as exc:
        assert comm.rank != 1 and list(exc.failures) == [1] and f"{cls.__name__}: " in exc.failures[1], exc
    except (TypeError, ValueError) as exc:
        assert comm.rank == 1 and (option in str(exc) or option == "params" and "float64" in str(exc)), exc
    else:
        raise AssertionError(f"rank {comm.rank} built the optimizer")


def onebit_adam_reference(comm: compcoll.Communicator, freeze_step: int, steps: int, ranks_per_node: int = 0,
                          compress: str = "update", scale: str = "l1", bias_correction: bool = False,
                          protocol: str = "auto") -> None:
    """OneBitAdam equals a one-process simulation of every rank (reference 1-bit allreduce), bit for bit.

    With ``ranks_per_node`` the ranks form nodes and the optimizer must pick the
    hierarchical compensated allreduce; the simulation uses its reference. With
    ``bias_correction`` the simulation divides m by 1 - b1^t and v by 1 - b2^min(t, freeze_step).
    """
    n = comm.size
    model, opt = build(comm, "OneBitAdam", freeze_step=freeze_step, weight_decay=0.01, compress=compress, scale=scale,
                       bias_correction=bias_correction, protocol=protocol)
    assert opt.channel.hierarchical == bool(ranks_per_node)
    assert opt.channel.protocol == protocol_for(protocol, n // ranks_per_node if ranks_per_node else n)
    b1, b2, lr, eps, wd = 0.9, 0.999, 1e-2, 1e-8, 0.01
    with seeded(100):
        sim = Net()
    p = flat_params(sim).clone()
    numel = p.numel()
    lengths = compcoll.hierarchical_error_numels(numel, n, ranks_per_node or n)
    if not ranks_per_node:
        lengths = (compcoll.padded_numel(numel, n), lengths[1])
    m, v = torch.zeros(numel), torch.zeros(numel)
    we = [np.zeros(lengths[0], np.float32) for _ in range(n)]
    se = [np.zeros(lengths[1], np.float32) for _ in range(n)]

    for step in range(steps):
        grads = _world_grads([sim] * n, [p] * n, step)
        t = step + 1
        k = min(t, freeze_step) if bias_correction else 0
        if step < freeze_step:
            avg = _exact(grads)
            m.mul_(b1).add_(avg, alpha=1 - b1)
            v.mul_(b2).addcmul_(avg, avg, value=1 - b2)
        denom = _denominator(v, k, b2, eps)
        if step >= freeze_step:
            m = _sent([torch.add(m.mul(b1), g, alpha=1 - b1) for g in grads], we, se, v == 0, compress, denom,
                      ranks_per_node, scale, protocol)
        update = m / denom
        if bias_correction:
            update.div_(1 - b1 ** t)
        p.add_(update.add_(p, alpha=wd), alpha=-lr)
        train(comm, model, opt, range(step, step + 1))
        assert torch.equal(opt.flat.data.view(torch.int32), p.view(torch.int32)), f"step {step}: params differ"
        assert np.array_equal(opt.channel.worker_error.numpy(), we[comm.rank]), f"step {step}: worker error"
        assert np.array_equal(opt.channel.server_error.numpy(), se[comm.rank]), f"step {step}: server error"


def synchronize_between_syncs(comm: compcoll.Communicator, at: int) -> None:
    """ZeroOneAdam between synchronisations: replicas differ; ``synchronize()`` makes them bit-identical."""
    model, opt = build(comm, "ZeroOneAdam")
    train(comm, model, opt, range(at))
    assert not opt.synchronized
    rows = torch.empty(comm.size * opt.flat.numel)
    comm.allgather(opt.flat.data, rows)
    if comm.size > 1:
        assert not torch.equal(rows.view(comm.size, -1)[0], rows.view(comm.size, -1)[1]), "local steps left no trace"
    opt.synchronize()
    assert opt.synchronized
    assert_same_on_all_ranks(comm, opt.flat.data)
    train(comm, model, opt, range(at, STEPS))


def _world_grads(sims: list[Net], params: list[torch.Tensor], step: int) -> list[torch.Tensor]:
    """Every rank's flat gradient at ``step``, rank q's computed at ``params[q]``."""
    grads = []
    for q, (sim, p) in enumerate(zip(sims, params)):
        torch.nn.utils.vector_to_parameters(p, sim.parameters())
        sim.zero_grad()
        tokens, x, y = batch(q, step)
        torch.nn.functional.cross_entropy(sim(tokens, x), y).backward()
        grads.append(torch.cat([t.grad.reshape(-1) for t in sim.parameters()]))
    return grads


def _exact(grads: list[torch.Tensor]) -> torch.Tensor:
    total = grads[0].clone()
    for g in grads[1:]:
        total.add_(g)
    return total.div_(len(grads))


def _onebit(values: list[torch.Tensor], we: list[np.ndarray], se: list[np.ndarray], silent: torch.Tensor,
            ranks_per_node: int = 0, scale: str = "l2", protocol: str = "auto") -> torch.Tensor:
    """The reference 1-bit allreduce of every rank's vector, zero where ``silent``, errors cleared there.

    With ``ranks_per_node`` k, the hierarchical compensated form: rank m*k + j's worker error
    covers shard j of the padded vector, its server error sub-chunk m of that shard. "auto" stands for the
    protocol the optimizers pick between the ranks, or the nodes (``spec.protocol_for``).
    """
    n = len(values)
    protocol = protocol_for(protocol, n // ranks_per_node if ranks_per_node else n)
    if ranks_per_node:
        outs, new_we, new_se, _ = reference.hierarchical_compressed_allreduce(
            [v.numpy() for v in values], we, se, ranks_per_node, scale, None, protocol)
        shard, sub = we[0].size, se[0].size
        starts = [((r % ranks_per_node) * shard, (r % ranks_per_node) * shard + (r // ranks_per_node) * sub)
                  for r in range(n)]
    else:
        outs, new_we, new_se, _ = reference.compressed_allreduce([v.numpy() for v in values], we, se, protocol,
                                                                 scale)
        starts = [(0, r * se[0].size) for r in range(n)]
    mask = np.concatenate([silent.numpy(), np.zeros(n * se[0].size, bool)])
    for q, (worker_start, server_start) in enumerate(starts):
        we[q][:] = new_we[q]
        we[q][mask[worker_start:worker_start + we[q].size]] = 0.0
        se[q][:] = new_se[q]
        se[q][mask[server_start:server_start + se[q].size]] = 0.0
    return torch.from_numpy(outs[0]).masked_fill_(silent, 0.0)


def _sent(values: list[torch.Tensor], we: list[np.ndarray], se: list[np.ndarray], silent: torch.Tensor,
          compress: str, denom: torch.Tensor, ranks_per_node: int = 0, scale: str = "l2",
          protocol: str = "auto") -> torch.Tensor:
    """What an optimizer's 1-bit average gives: of the vectors themselves, or (``"update"``) denom * that of
    vector / denom."""
    if compress == "momentum":
        return _onebit(values, we, se, silent, ranks_per_node, scale, protocol)
    preconditioned = [x.div(denom).masked_fill_(silent, 0.0) for x in values]
    return _onebit(preconditioned, we, se, silent, ranks_per_node, scale, protocol).mul_(denom)


def zero_one_adam_reference(comm: compcoll.Communicator, steps: int, compress: str = "update",
                            scale: str = "l1", bias_correction: bool = False, floors: bool = True) -> None:
    """ZeroOneAdam equals a one-process simulation of every rank's copy, bit for bit, through both phases.

    With ``bias_correction`` the simulation divides m by 1 - b1^s and v by 1 - b2^k (k: the refreshes so far)
    wherever it uses them, and multiplies the m it rebuilds at a synchronisation by 1 - b1^s. ``floors``: the
    run must raise v by the variance floor at least once.
    """
    n, wd = comm.size, 0.01
    model, opt = build(comm, "ZeroOneAdam", weight_decay=wd, compress=compress, scale=scale,
                       bias_correction=bias_correction)
    kw = CONFIGS["ZeroOneAdam"][1]
    b1, b2, lr, eps, vf = 0.9, 0.999, kw["lr"], 1e-8, kw["var_freeze_step"]
    with seeded(100):
        start = flat_params(Net()).clone()
        sims = [Net() for _ in range(n)]
    numel = start.numel()
    full = compcoll.padded_numel(numel, n)
    p = [start.clone() for _ in range(n)]
    m = [torch.zeros(numel) for _ in range(n)]
    acc = [torch.zeros(numel) for _ in range(n)]
    v, synced = torch.zeros(numel), None
    we = [np.zeros(full, np.float32) for _ in range(n)]
    se = [np.zeros(full // n, np.float32) for _ in range(n)]
    var_interval, var_count, local_interval, local_count, lr_sum, floored = 1, 0, 1, 0, 0.0, 0
    refreshes = 0

    def corrected(update: torch.Tensor, t: int) -> torch.Tensor:
        return update.div_(1 - b1 ** t) if t else update

    for step in range(steps):
        s = step + 1
        grads = _world_grads(sims, p, step)
        silent = v == 0
        if s <= vf:
            refresh = s % var_interval == 0
            refreshes += refresh
            t, k = (s, refreshes) if bias_correction else (0, 0)
            if refresh or compress == "momentum":
                source = _exact(grads) if refresh else _onebit(grads, we, se, silent, scale=scale)
                if refresh:
                    v.mul_(b2).addcmul_(source, source, value=1 - b2)
                for q in range(n):
                    m[q].mul_(b1).add_(source, alpha=1 - b1)
            else:
                locals_ = [torch.add(m[q].mul(b1), grads[q], alpha=1 - b1) for q in range(n)]
                common = _sent(locals_, we, se, silent, compress, _denominator(v, k, b2, eps), scale=scale)
                m = [common.clone() for _ in range(n)]
            floored, v = _floor(v, m[0], b1, b2, floored, t, k)
            denom = _denominator(v, k, b2, eps)
            for q in range(n):
                update = corrected(m[q] / denom, t).add_(p[q], alpha=wd)
                p[q].add_(update, alpha=-lr)
            if refresh:
                var_count += 1
                if var_count == kw["var_update_scaler"]:
                    var_count, var_interval = 0, var_interval * 2
            if s == vf:
                we = [np.zeros_like(e) for e in we]
                se = [np.zeros_like(e) for e in se]
                synced = p[0].clone()
        else:
            t, k = (s, refreshes) if bias_correction else (0, 0)
            denom = _denominator(v, k, b2, eps)
            for q in range(n):
                m[q].mul_(b1).add_(grads[q], alpha=1 - b1)
                update = corrected(m[q] / denom, t).masked_fill_(silent, 0.0).add_(p[q], alpha=wd)
                p[q].add_(update, alpha=-lr)
                acc[q].add_(update, alpha=lr)
            lr_sum += lr
            if s % local_interval == 0:
                if compress == "update":
                    mean = _onebit([a.masked_fill(silent, 0.0) for a in acc], we, se, silent, scale=scale)
                    synced = synced - mean
                    m = [mean.mul(denom).div_(lr_sum) for _ in range(n)]
                else:
                    mean = _onebit([a.mul(denom) for a in acc], we, se, silent, scale=scale)
                    synced = synced - mean / denom
                    m = [mean / lr_sum for _ in range(n)]
                if t:
                    m = [mq.mul_(1 - b1 ** t) for mq in m]
                floored, v = _floor(v, m[0], b1, b2, floored, t, k)
                p = [synced.clone() for _ in range(n)]
                acc = [torch.zeros(numel) for _ in range(n)]
                lr_sum = 0.0
            local_count += 1
            if local_count == kw["local_step_scaler"]:
                local_count, local_interval = 0, min(kw["local_step_clipper"], local_interval * 2)
        train(comm, model, opt, range(step, step + 1))
        assert torch.equal(opt.flat.data.view(torch.int32), p[comm.rank].view(torch.int32)), f"step {step}: params"
        assert torch.equal(opt.exp_avg.view(torch.int32), m[comm.rank].view(torch.int32)), f"step {step}: momentum"
        assert np.array_equal(opt.channel.worker_error.numpy(), we[comm.rank]), f"step {step}: worker error"
    assert floored or not floors, "the variance floor never raised v: this run does not test it"


def birder_reference(comm: compcoll.Communicator, steps: int) -> None:
    """Birder equals a one-process simulation (reference hierarchical allreduce, OR of seen masks), bit for bit."""
    n, wd, b1, b2 = comm.size, 0.01, 0.9, 0.9
    model, opt = build(comm, "Birder", weight_decay=wd)
    lr = CONFIGS["Birder"][1]["lr"]
    with seeded(100):
        p = flat_params(Net()).clone()
        sims = [Net() for _ in range(n)]
    numel = p.numel()
    m = [torch.zeros(numel) for _ in range(n)]
    b = [torch.zeros(numel) for _ in range(n)]
    seen = [torch.zeros(numel, dtype=torch.bool) for _ in range(n)]
    for step in range(steps):
        grads = _world_grads(sims, [p] * n, step)
        ratios = []
        for q in range(n):
            seen[q] |= grads[q] != 0
            m[q].mul_(b1).add_(grads[q], alpha=1 - b1)
            b[q].mul_(b2).add_(grads[q].abs(), alpha=1 - b2)
            ratios.append((m[q] / b[q]).masked_fill_(b[q] == 0, 0.0).numpy())
        live = torch.stack(seen).any(dim=0)
        outs, _ = reference.hierarchical_allreduce(ratios, n, 0, step)
        mean = torch.from_numpy(outs[0]).masked_fill_(~live, 0.0).add_(p, alpha=wd)
        p = p.add(mean, alpha=-lr)
        train(comm, model, opt, range(step, step + 1))
        assert torch.equal(opt.flat.data.view(torch.int32), p.view(torch.int32)), f"step {step}: params"
        assert torch.equal(opt.live, live), f"step {step}: live coordinates"


def _denominator(v: torch.Tensor, k: int, b2: float, eps: float) -> torch.Tensor:
    """sqrt(v) + eps, with v bias-corrected by 1 - b2^k first where k > 0 (``moments.preconditioner``'s order)."""
    denom = v.sqrt()
    return (denom.div_(math.sqrt(1 - b2 ** k)) if k else denom).add_(eps)


def _floor(v: torch.Tensor, m: torch.Tensor, b1: float, b2: float, floored: int, t: int = 0,
           k: int = 0) -> tuple[int, torch.Tensor]:
    """0/1 Adam's variance floor max(v, m^2 (1-b2)/(1-b1)^2), the bound times (1-b2^k)/(1-b1^t)^2 with bias
    correction (t, k > 0), and ``floored`` + 1 if it raised v."""
    c = (1 - b2) / (1 - b1) ** 2
    if t and k:
        c *= (1 - b2 ** k) / (1 - b1 ** t) ** 2
    new = torch.maximum(v, m.square().mul_(c))
    return floored + (not torch.equal(new, v)), new


def _norm(t: torch.Tensor) -> float:
    return math.sqrt(reference.sumsq(t.numpy()))


def _trust_ratio(p: torch.Tensor, update: torch.Tensor) -> float:
    """LAMB's clipped ||p|| / ||u|| at OneBitLamb's default clip [0.01, 10]; 1 where either norm is 0."""
    w, u = _norm(p), _norm(update)
    return min(max(w / u, 0.01), 10.0) if w and u else 1.0


def onebit_lamb_reference(comm: compcoll.Communicator, steps: int, compress: str = "update", scale: str = "l1",
                          trust_ratio: str = "fresh", protocol: str = "auto", refresh: int = 0,
                          layer_scales: bool = False) -> None:
    """OneBitLamb equals a one-process simulation of every rank, bit for bit, through warmup and compression
    (with ``refresh`` > 0, every ``refresh``-th compression-phase step is a warmup step; with ``layer_scales``,
    each layer goes through its own 1-bit average with its own error buffers)."""
    n, wd, lr, fs = comm.size, 0.01, CONFIGS["OneBitLamb"][1]["lr"], CONFIGS["OneBitLamb"][1]["freeze_step"]
    b1, b2, eps, cb, fmin, fmax, thr = 0.9, 0.999, 1e-8, 0.9, 0.5, 4.0, 0.1
    model, opt = build(comm, "OneBitLamb", weight_decay=wd, compress=compress, scale=scale, trust_ratio=trust_ratio,
                       protocol=protocol, variance_refresh=refresh, layer_scales=layer_scales)
    with seeded(100):
        sim = Net()
    p = flat_params(sim).clone()
    layers, start = [], 0
    for t in sim.parameters():
        layers.append(slice(start, start + t.numel()))
        start += t.numel()
    numel = p.numel()
    m, v, fresh = torch.zeros(numel), torch.zeros(numel), torch.zeros(numel)
    frozen, last_factor, scaling = [0.0] * len(layers), [1.0] * len(layers), None
    parts = layers if layer_scales else [slice(0, numel)]
    errors = [([np.zeros(compcoll.padded_numel(sl.stop - sl.start, n), np.float32) for _ in range(n)],
               [np.zeros(compcoll.padded_numel(sl.stop - sl.start, n) // n, np.float32) for _ in range(n)])
              for sl in parts]

    def by_part(send: Callable[..., torch.Tensor], values: list[torch.Tensor], silent: torch.Tensor,
                *extra: torch.Tensor) -> torch.Tensor:
        """``send`` on each part (the whole vector, or each layer) with that part's error buffers."""
        return torch.cat([send([x[sl] for x in values], we, se, silent[sl], *(e[sl] for e in extra))
                          for sl, (we, se) in zip(parts, errors)])

    for step in range(steps):
        grads = _world_grads([sim] * n, [p] * n, step)
        refreshing = step >= fs and refresh > 0 and (step - fs) % refresh == refresh - 1
        if step < fs or refreshing:
            avg = _exact(grads)
            m.mul_(b1).add_(avg, alpha=1 - b1)
            v.mul_(b2).addcmul_(avg, avg, value=1 - b2)
            if step + 1 == fs or refreshing:
                fresh = v.clone()
            for i, sl in enumerate(layers):
                update = (m[sl] / v[sl].sqrt().add_(eps)).add_(p[sl], alpha=wd)
                coeff = _trust_ratio(p[sl], update)
                if coeff != 1.0:
                    frozen[i] = cb * frozen[i] + (1 - cb) * coeff
                p[sl].add_(update, alpha=-lr * coeff)
        else:
            last = m.clone()
            locals_ = [torch.add(m.mul(b1), g, alpha=1 - b1) for g in grads]
            if compress == "update":
                m = by_part(lambda x, we, se, silent, denom: _sent(x, we, se, silent, compress, denom, scale=scale,
                                                                   protocol=protocol),
                            locals_, v == 0, v.sqrt().add_(eps))
            else:
                if scaling is None:
                    ratios = [_norm(m[sl]) / math.sqrt(sl.stop - sl.start) for sl in layers]
                    scaling = [(sum(ratios) / len(ratios)) / r if r else 1.0 for r in ratios]
                for local in locals_:
                    for sl, s in zip(layers, scaling):
                        local[sl].mul_(s)
                m = by_part(lambda x, we, se, silent: _onebit(x, we, se, silent, scale=scale, protocol=protocol),
                            locals_, v == 0)
                for sl, s in zip(layers, scaling):
                    m[sl].div_(s)
            if trust_ratio == "fresh":
                for sl in layers:
                    update = (m[sl] / v[sl].sqrt().add_(eps)).add_(p[sl], alpha=wd)
                    p[sl].add_(update, alpha=-lr * _trust_ratio(p[sl], update))
            else:
                rebuilt = (m - last * b1) / (1 - b1)
                fresh.mul_(b2).addcmul_(rebuilt, rebuilt, value=1 - b2)
                for i, sl in enumerate(layers):
                    denom = v[sl].sqrt().add_(eps)
                    prelim = m[sl] / denom
                    update = prelim.add(p[sl], alpha=wd)
                    factor = (denom / fresh[sl].sqrt().add_(eps)).max().item()
                    ratio = min(1.0, _norm(prelim) / _norm(update))
                    factor = min(max(factor * ratio + (1.0 - ratio), fmin), fmax)
                    factor = min(max(factor, last_factor[i] * (1 - thr)), last_factor[i] * (1 + thr))
                    last_factor[i] = factor
                    p[sl].add_(update, alpha=-lr * frozen[i] * factor)
        train(comm, model, opt, range(step, step + 1))
        assert torch.equal(opt.flat.data.view(torch.int32), p.view(torch.int32)), f"step {step}: params"
        saved = opt.channel.state_dict()
        for (we, se), state in zip(errors, saved["layers"] if layer_scales else [saved], strict=True):
            assert np.array_equal(state["worker_error"].numpy(), we[comm.rank]), f"step {step}: worker error"
            assert np.array_equal(state["server_error"].numpy(), se[comm.rank]), f"step {step}: server error"


def step_mismatch(comm: compcoll.Communicator, name: str, change: str) -> None:
    """Ranks out of step from step 6 on (past every warm-up, so every rank's calls are of one kind): the next step
    raises RankMismatchError on every rank, naming what differs, before anything changes.

    ``change`` "resume": rank r resumes from step 6 + r's checkpoint (0/1 Adam's replicas drifted apart, the
    others' schedules ran out of step, with nothing said). "lr": rank 0 alone halves its learning rate, as a
    scheduler stepped on rank 0 only would (the replicas trained apart).
    """
    model, opt = build(comm, name)
    saved = {}
    for at in range(6 + comm.size):
        saved[at] = _checkpoint(model, opt)
        train(comm, model, opt, range(at, at + 1))
    if change == "resume":
        opt.load_state_dict(torch.load(io.BytesIO(saved[6 + comm.rank]), weights_only=True)["optimizer"])
        expected = "different steps (" + ", ".join(f"rank {r}: {6 + r}" for r in range(comm.size)) + ")"
    else:
        if comm.rank == 0:
            opt.param_groups[0]["lr"] /= 2
        others, lr = list(range(1, comm.size)), CONFIGS[name][1]["lr"]
        expected = (f"at step {6 + comm.size} the hyperparameters of the parameter groups of rank(s) {others} differ "
                    f"from rank 0's (lr of group 0: {lr / 2!r} on rank(s) [0], {lr!r} on rank(s) {others}): a "
                    f"learning-rate")
    before = whole_state(opt)
    params = opt.flat.data.clone()
    try:
        train(comm, model, opt, range(6 + comm.size, 7 + comm.size))
    except compcoll.RankMismatchError as exc:
        assert expected in str(exc), exc
    else:
        raise AssertionError("no RankMismatchError")
    assert torch.equal(opt.flat.data, params), "the refused step changed the parameters"
    for key, value in before["buffers"].items():
        assert torch.equal(value, whole_state(opt)["buffers"][key]), f"the refused step changed {key}"
