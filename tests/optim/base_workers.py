"""Rank-side bodies of the shared optimizer frame's collective calls: ``add_param_group`` on a built optimizer."""

from __future__ import annotations

import torch

import compcoll
from compcoll.launcher import seeded
from tests.algorithms.onebit_workers import assert_same_on_all_ranks
from tests.optim.optim_workers import CONFIGS, Net, _tensors, whole_state

GROWN_AT, STEPS = 2, 12
"""The step before which ``out`` joins (in every warm-up of ``CONFIGS``), and the steps run (into the 1-bit ones)."""
OPTIMIZERS = {**CONFIGS, "OneBitLamb frozen": (CONFIGS["OneBitLamb"][0], dict(CONFIGS["OneBitLamb"][1],
                                                                              trust_ratio="frozen"))}
"""``CONFIGS`` and 1-bit LAMB with frozen trust ratios (its per-layer factors start at 1)."""
EQUAL = ["OneBitAdam", "OneBitAdam bc", "OneBitLamb", "OneBitLamb layers", "OneBitLamb frozen", "ZeroOneAdam"]
"""The optimizers whose grown run equals one built with every group: no 1-bit step before ``GROWN_AT``."""


def _step(comm: compcoll.Communicator, model: Net, opt, step: int) -> None:
    """Seeded gradients of this rank; ``out`` gets none before ``GROWN_AT`` (it is not trained yet)."""
    gen = torch.Generator().manual_seed(1000 * comm.rank + step)
    for name, p in model.named_parameters():
        p.grad = None if name.startswith("out.") and step < GROWN_AT else torch.randn(p.shape, generator=gen)
    opt.step()


def _run(comm: compcoll.Communicator, name: str, grown: bool) -> tuple[Net, compcoll.optim.CompressedOptimizer]:
    """``STEPS`` steps of ``name`` on ``Net``: ``out`` (lr 3e-3) added by ``add_param_group`` at ``GROWN_AT``
    (``grown``), or a group from the start that has no gradient until then."""
    with seeded(100 + comm.rank):
        model = Net()
    cls, kwargs = OPTIMIZERS[name]
    first = [*model.emb.parameters(), *model.hidden.parameters()]
    later = {"params": list(model.out.parameters()), "lr": 3e-3}
    opt = cls(first if grown else [{"params": first}, later], comm=comm, **kwargs)
    for step in range(STEPS):
        if grown and step == GROWN_AT:
            opt.add_param_group(later)
        _step(comm, model, opt, step)
    return model, opt


def grown_equals_built_with_every_group(comm: compcoll.Communicator, names: list[str]) -> None:
    """A group added to a built optimizer in its warm-up trains as if it had been there from the start without a
    gradient: parameters, masters, moments, counters and error feedback bit for bit, through the 1-bit steps after,
    and replicas identical. Birder, which compresses from its first step (its random bits follow the vector's
    length), trains the new group on every rank alike."""
    for name in names:
        (grown_model, grown), (built_model, built) = _run(comm, name, True), _run(comm, name, False)
        assert len(grown.param_groups) == 2 and grown.param_groups[1]["lr"] == 3e-3
        if name in EQUAL:
            for a, b in zip(grown_model.parameters(), built_model.parameters()):
                assert torch.equal(a, b), f"{name}: a parameter differs from the optimizer built with every group"
            for a, b in zip(_tensors(whole_state(grown)), _tensors(whole_state(built))):
                assert torch.equal(a, b), f"{name}: the state differs from the optimizer built with every group"
        with seeded(100):
            start = Net().out.weight.detach()
        assert not torch.equal(grown_model.out.weight.detach(), start), f"{name}: the added group did not train"
        assert set(grown.state[grown_model.out.weight]) == set(built.state[built_model.out.weight])
        assert_same_on_all_ranks(comm, grown.flat.data)


def growth_refused_everywhere(comm: compcoll.Communicator) -> None:
    """``add_param_group`` called out of turn: with another shape on the last rank (RankMismatchError, every rank);
    with a float64 parameter on the last rank (TypeError there, RemoteError on the others); a parameter it already
    trains (torch's ValueError); on a last rank that froze a trained parameter since the last step (ValueError
    there, RemoteError on the others); after 1-bit Adam's variance froze, or where 0/1 Adam's next variance refresh
    comes after its variance phase (ValueError, every rank). Each time the groups stay as they were and training goes
    on, replicas identical."""
    with seeded(100 + comm.rank):
        model = Net()
    cls, kwargs = CONFIGS["OneBitAdam"]
    opt = cls([*model.emb.parameters(), *model.hidden.parameters()], comm=comm, **kwargs)
    last = comm.rank == comm.size - 1
    wrong = {
        "shape": (torch.nn.Parameter(torch.zeros(4 if last else 3)), compcoll.RankMismatchError,
                  compcoll.RankMismatchError, "sizes differ across ranks"),
        "dtype": (torch.nn.Parameter(torch.zeros(3, dtype=torch.float64 if last else torch.float32)), TypeError,
                  compcoll.RemoteError, "float64"),
        "twice": (model.hidden.bias, ValueError, ValueError, "more than one parameter group"),
        "frozen since": (torch.nn.Parameter(torch.zeros(3)), ValueError, compcoll.RemoteError,
                         "was trained when the optimizer was built and is frozen now"),
    }
    for what, (param, mine, others, said) in wrong.items():
        model.hidden.bias.requires_grad_(not (what == "frozen since" and last))
        _refused(opt, [param], mine if last else others, said)
        model.hidden.bias.requires_grad_(True)
        assert opt.flat.numel == 20 * 4 + 7 * 5 + 5
        _step(comm, model, opt, 0)
    while not opt.compressing:
        _step(comm, model, opt, opt.steps)
    _refused(opt, list(model.out.parameters()), ValueError,
             "add_param_group at step 4: its variance froze at step 4 (freeze_step)")
    _step(comm, model, opt, opt.steps)
    assert_same_on_all_ranks(comm, opt.flat.data)
    zero_one = CONFIGS["ZeroOneAdam"][0]([*model.emb.parameters(), *model.hidden.parameters()], comm=comm,
                                         var_freeze_step=7, var_update_scaler=2)
    for step in range(6):  # refreshes at steps 1, 2, 4, 6: every 4 steps now, the next at 8
        _step(comm, model, zero_one, step)
    _refused(zero_one, list(model.out.parameters()), ValueError,
             "refreshed next at step 8 (every 4 steps now), after it freezes at step 7")


def _refused(opt, params: list[torch.Tensor], error: type, said: str) -> None:
    """``opt.add_param_group`` of ``params`` raises ``error`` saying ``said``, and the groups stay as they were."""
    groups = len(opt.param_groups)
    try:
        opt.add_param_group({"params": params})
    except error as exc:
        assert said in str(exc), exc
    else:
        raise AssertionError(f"no {error.__name__} on rank {opt.comm.rank}: {said}")
    assert len(opt.param_groups) == groups
