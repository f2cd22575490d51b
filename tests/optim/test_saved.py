"""compcoll.optim.saved: optimizers' state in torch's layout, torch.distributed.checkpoint, the older layout."""

from __future__ import annotations

import pytest
import torch

import compcoll
from compcoll.optim import Birder, OneBitAdam, OneBitLamb, ZeroOneAdam
from tests.optim.optim_workers import whole_state
from tests.pool import run

WORKERS = "tests.optim.saved_workers"
ALL = (OneBitAdam, OneBitLamb, ZeroOneAdam, Birder)


def _trained(cls) -> tuple[torch.nn.Module, compcoll.optim.CompressedOptimizer]:
    """A small model with a frozen layer, two steps of ``cls`` on one rank."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(5, 7), torch.nn.Tanh(), torch.nn.Linear(7, 3), torch.nn.Linear(3, 2))
    model[2].requires_grad_(False)
    opt = cls(model.parameters(), comm=compcoll.SingleComm())
    for _ in range(2):
        opt.zero_grad()
        model(torch.randn(4, 5)).square().sum().backward()
        opt.step()
    return model, opt


@pytest.mark.parametrize("cls", ALL)
def test_the_state_is_per_parameter_as_torch_lays_it_out(cls) -> None:
    """``state_dict()["state"]`` holds each trained parameter's part of the buffers, in its shape, by its index in
    the groups (frozen ones have none); ``opt.state[p]`` holds views of the same buffers."""
    model, opt = _trained(cls)
    params = list(model.parameters())
    state = opt.state_dict()
    trained = [i for i, p in enumerate(params) if p.requires_grad]
    assert sorted(state["state"]) == trained and state["param_groups"][0]["params"] == list(range(len(params)))
    for i in trained:
        for name, value in state["state"][i].items():
            assert value.shape == params[i].shape and torch.equal(value, opt.state[params[i]][name]), (i, name)
    name = next(iter(opt.state[params[0]]))
    opt.state[params[0]][name].zero_()
    assert not bool(getattr(opt, name)[:params[0].numel()].any()), "opt.state is not a view of the buffers"
    assert "compcoll" not in opt.param_groups[0]


@pytest.mark.parametrize("cls", ALL)
def test_a_state_of_the_older_layout_loads_alike(cls) -> None:
    """A state saved before 2026-11-30 (the whole state under "state") loads as its torch-layout form does."""
    model, opt = _trained(cls)
    whole = whole_state(opt)
    groups = [{k: v for k, v in g.items() if k != "compcoll"} for g in opt.state_dict()["param_groups"]]
    for state in ({"state": whole, "param_groups": groups}, opt.state_dict()):
        _, fresh = _trained(cls)
        for buf in fresh._buffers.values():
            buf.zero_()
        fresh.load_state_dict(state)
        loaded = whole_state(fresh)
        assert loaded["steps"] == whole["steps"] and loaded["scalars"] == whole["scalars"]
        assert all(torch.equal(loaded["buffers"][k], v) for k, v in whole["buffers"].items())


def test_a_torch_optimizers_state_is_refused() -> None:
    model, opt = _trained(OneBitAdam)
    adam = torch.optim.Adam(model.parameters())
    with pytest.raises(ValueError, match="no 'compcoll' entry .* a torch optimizer's state does not load"):
        opt.load_state_dict(adam.state_dict())


@pytest.mark.parametrize("name, at, elastic", [("OneBitAdam", 9, False), ("OneBitLamb", 9, True),
                                               ("ZeroOneAdam", 11, True), ("Birder", 9, False)])
def test_torch_distributed_checkpoint_resumes_exactly(name: str, at: int, elastic: bool, tmp_path) -> None:
    run(f"{WORKERS}:distributed_checkpoint_resumes_exactly", 2, "gloo", args=(name, at, str(tmp_path), elastic))


@pytest.mark.parametrize("name, at, saved_by, loaded_by, listed", [
    ("OneBitAdam", 9, 2, 3, False), ("Birder", 9, 2, 3, True), ("ZeroOneAdam", 11, 3, 2, False)])
def test_torch_distributed_checkpoint_resumes_on_another_world_size(name: str, at: int, saved_by: int,
                                                                    loaded_by: int, listed: bool, tmp_path) -> None:
    """``ElasticLoadPlanner``: a grown or shrunk world resumes from ``dcp.save``'s checkpoint as from
    ``compcoll.checkpoint``'s files (an elastic restart); the optimizer's state in a dict or (``listed``) a list."""
    args = (name, at, str(tmp_path), listed)
    run(f"{WORKERS}:saved_for_another_world", saved_by, "gloo", args=args)
    run(f"{WORKERS}:resumed_on_another_world", loaded_by, "gloo", args=args + (saved_by,))
