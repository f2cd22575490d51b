"""compcoll.optim.carry: torch Adam's state into 1-bit Adam (DeepSpeed's checkpoints: test_from_deepspeed.py)."""

from __future__ import annotations

import pytest
import torch

import compcoll
from compcoll.launcher import run_threads
from compcoll.optim import OneBitAdam, OneBitLamb, load_torch_adam_state, torch_adam_state
from tests.optim.optim_workers import Net, batch


def _step(model: torch.nn.Module, opt: torch.optim.Optimizer, rank: int, i: int) -> None:
    tokens, x, y = batch(rank, i)
    opt.zero_grad()
    torch.nn.functional.cross_entropy(model(tokens, x), y).backward()
    opt.step()


def _adamw_run(steps: int) -> tuple[Net, torch.optim.AdamW]:
    torch.manual_seed(0)
    model = Net()
    adamw = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.01)
    for i in range(steps):
        _step(model, adamw, 0, i)
    return model, adamw


def _switched(model: Net, adamw: torch.optim.AdamW, carried: bool, comm: compcoll.Communicator, **options
              ) -> tuple[Net, OneBitAdam]:
    """A copy of ``model`` under a OneBitAdam of AdamW's settings, given AdamW's state when ``carried``."""
    copy = Net()
    copy.load_state_dict(model.state_dict())
    opt = OneBitAdam(copy.parameters(), lr=1e-2, weight_decay=0.01, bias_correction=True, comm=comm,
                     **{"freeze_step": 100, **options})
    if carried:
        load_torch_adam_state(opt, adamw.state_dict())
    return copy, opt


def test_adamw_state_carries_its_moments_and_step_and_the_warmup_goes_on_as_adamw() -> None:
    """After 5 AdamW steps: the moments land bit for bit, the step count too, and 5 more warm-up steps stay within
    float32 rounding of AdamW's own (4.8e-7 here), where fresh moments end 1e-3 and more away."""
    model, adamw = _adamw_run(5)
    far = {}
    for carried in (True, False):
        copy, opt = _switched(model, adamw, carried, compcoll.SingleComm())
        if carried:
            params = list(model.parameters())
            assert opt.steps == 5
            for p, seg in zip(params, opt.flat.segments):
                for name in ("exp_avg", "exp_avg_sq"):
                    assert torch.equal(getattr(opt, name)[seg.start:seg.stop], adamw.state[p][name].reshape(-1))
        reference, reference_opt = _adamw_run(5)
        for i in range(5, 10):
            _step(reference, reference_opt, 0, i)
            _step(copy, opt, 0, i)
        far[carried] = max(float((p - q).detach().abs().max()) for p, q in zip(reference.parameters(),
                                                                               copy.parameters()))
    assert far[True] < 1e-5 < 1e-3 < far[False], far


def test_adam_state_at_the_freeze_step_compresses_next_alike_on_every_rank() -> None:
    """freeze_step at Adam's step: the next step compresses with v frozen at Adam's, on 2 ranks, replicas equal."""
    model, adamw = _adamw_run(4)
    finals = {}

    def rank(comm: compcoll.Communicator) -> None:
        copy, opt = _switched(model, adamw, True, comm, freeze_step=4)
        frozen = opt.exp_avg_sq.clone()
        for i in range(4, 7):
            _step(copy, opt, comm.rank, i)
        assert opt.compressing and torch.equal(opt.exp_avg_sq, frozen)
        finals[comm.rank] = torch.cat([p.detach().reshape(-1) for p in copy.parameters()])

    run_threads(rank, 2)
    assert torch.equal(finals[0], finals[1])


def test_what_does_not_carry_is_refused_and_changes_nothing() -> None:
    model, adamw = _adamw_run(2)
    amsgrad = torch.optim.Adam(model.parameters(), amsgrad=True)
    _step(model, amsgrad, 0, 0)
    copy, opt = _switched(model, adamw, False, compcoll.SingleComm())
    for state, message in ((amsgrad.state_dict(), "AMSGrad's"), ({"state": {}}, "expected an optimizer's"),
                           ({**adamw.state_dict(), "param_groups": [{"params": [0]}]}, r"parameter groups of \[1\]")):
        with pytest.raises(ValueError, match=message):
            load_torch_adam_state(opt, state)
    assert opt.steps == 0 and not bool(opt.exp_avg.any())
    with pytest.raises(ValueError, match="carries into a OneBitAdam, got a OneBitLamb"):
        load_torch_adam_state(OneBitLamb(copy.parameters(), comm=compcoll.SingleComm()), adamw.state_dict())


def test_load_state_dict_carries_a_torch_adam_state_with_a_warning() -> None:
    """What a framework does when it resumes a torch Adam's checkpoint into a OneBitAdam: ``load_state_dict``."""
    model, adamw = _adamw_run(3)
    _, opt = _switched(model, adamw, False, compcoll.SingleComm())
    with pytest.warns(UserWarning, match="carried a torch Adam's state in .* step 3"):
        opt.load_state_dict(adamw.state_dict())
    first = next(iter(model.parameters()))
    assert opt.steps == 3 and torch.equal(opt.exp_avg[:first.numel()], adamw.state[first]["exp_avg"].reshape(-1))


def test_a_parameter_adam_never_stepped_starts_from_zero_moments() -> None:
    """torch's Adam keeps no state for a parameter that had no gradient yet (a layer unused so far): it carries as
    zero moments (it failed as a missing exp_avg before), the others as saved; a state of no step is refused."""
    torch.manual_seed(0)
    used, unused = torch.nn.Linear(4, 3), torch.nn.Linear(4, 3)
    adamw = torch.optim.AdamW([*used.parameters(), *unused.parameters()], lr=1e-2)
    for _ in range(3):
        adamw.zero_grad()
        used(torch.randn(5, 4)).square().sum().backward()
        adamw.step()
    assert len(adamw.state) == 2
    opt = OneBitAdam([*used.parameters(), *unused.parameters()], comm=compcoll.SingleComm())
    opt.exp_avg.fill_(7.0)
    load_torch_adam_state(opt, adamw.state_dict())
    start = used.weight.numel() + used.bias.numel()
    assert opt.steps == 3 and not bool(opt.exp_avg[start:].any())
    assert torch.equal(opt.exp_avg[:used.weight.numel()], adamw.state[used.weight]["exp_avg"].reshape(-1))
    with pytest.raises(ValueError, match="no trained parameter has state"):
        load_torch_adam_state(opt, {"state": {}, "param_groups": adamw.state_dict()["param_groups"]})


def test_a_onebit_adam_goes_back_to_adamw_with_its_moments_and_step() -> None:
    """``torch_adam_state``: AdamW loads a 1-bit Adam's moments, step and hyperparameters after 5 warm-up steps and
    goes on as that 1-bit Adam would (within float32 rounding over 5 steps); carried back into a OneBitAdam, the
    moments land bit for bit; another optimizer is refused."""
    torch.manual_seed(0)
    model = Net()
    opt = OneBitAdam(model.parameters(), lr=1e-2, weight_decay=0.01, bias_correction=True, freeze_step=100,
                     comm=compcoll.SingleComm())
    for i in range(5):
        _step(model, opt, 0, i)
    copy = Net()
    copy.load_state_dict(model.state_dict())
    adamw = torch.optim.AdamW(copy.parameters(), lr=0.5, weight_decay=0.5)
    adamw.load_state_dict(torch_adam_state(opt))
    assert adamw.param_groups[0]["lr"] == 1e-2 and adamw.param_groups[0].get("decoupled_weight_decay", True)
    for i in range(5, 10):
        _step(model, opt, 0, i)
        _step(copy, adamw, 0, i)
    far = max(float((p - q).detach().abs().max()) for p, q in zip(model.parameters(), copy.parameters()))
    assert far < 1e-5, far
    back = OneBitAdam(Net().parameters(), comm=compcoll.SingleComm())
    load_torch_adam_state(back, adamw.state_dict())
    assert back.steps == 10 and torch.equal(back.exp_avg, torch.cat([adamw.state[p]["exp_avg"].reshape(-1)
                                                                    for p in copy.parameters()]))
    with pytest.raises(ValueError, match="takes a OneBitAdam, got a OneBitLamb"):
        torch_adam_state(OneBitLamb(Net().parameters(), comm=compcoll.SingleComm()))
