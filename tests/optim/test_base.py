"""The shared optimizer frame, one process: hyperparameter checks; checkpoints loaded, or refused with a clear error."""

from __future__ import annotations

import pytest
import torch

import compcoll
from compcoll.optim import Birder, OneBitAdam, OneBitLamb, ZeroOneAdam
from tests.optim.optim_workers import _tensors, whole_state
from tests.pool import run

ALL = [OneBitAdam, OneBitLamb, ZeroOneAdam, Birder]


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Linear(5, 3)


@pytest.mark.parametrize("cls", ALL)
def test_bad_options_name_the_problem(cls) -> None:
    comm = compcoll.SingleComm()
    with pytest.raises(ValueError, match="lr"):
        cls(_model().parameters(), lr=-1.0, comm=comm)
    with pytest.raises(ValueError, match="betas"):
        cls(_model().parameters(), betas=(0.9, 1.0), comm=comm)
    with pytest.raises(ValueError, match="nonfinite"):
        cls(_model().parameters(), comm=comm, nonfinite="ignore")
    with pytest.raises(TypeError, match="float32, float16 or bfloat16"):
        cls(_model().double().parameters(), comm=comm)


@pytest.mark.parametrize("cls", [OneBitAdam, OneBitLamb, ZeroOneAdam])
def test_compression_options_are_checked(cls) -> None:
    comm = compcoll.SingleComm()
    with pytest.raises(ValueError, match="compress 'gradient' is not one of"):
        cls(_model().parameters(), compress="gradient", comm=comm)
    with pytest.raises(ValueError, match="scale 'max' is not one of"):
        cls(_model().parameters(), scale="max", comm=comm)


def test_phase_options_are_checked() -> None:
    comm = compcoll.SingleComm()
    with pytest.raises(ValueError, match="eps"):
        OneBitAdam(_model().parameters(), eps=0.0, comm=comm)
    with pytest.raises(ValueError, match="freeze_step"):
        OneBitLamb(_model().parameters(), freeze_step=0, comm=comm)
    with pytest.raises(ValueError, match="trust_ratio must be one of fresh, frozen, got 'stale'"):
        OneBitLamb(_model().parameters(), trust_ratio="stale", comm=comm)
    with pytest.raises(ValueError, match="local_step_clipper"):
        ZeroOneAdam(_model().parameters(), local_step_clipper=0, comm=comm)


def test_warmup_as_a_share_of_the_run() -> None:
    """freeze_step / var_freeze_step in (0, 1) is that share of total_steps, rounded; without total_steps, an error."""
    comm = compcoll.SingleComm()
    assert OneBitAdam(_model().parameters(), freeze_step=0.15, total_steps=60, comm=comm).freeze_step == 9
    assert OneBitAdam(_model().parameters(), freeze_step=7, comm=comm).freeze_step == 7
    assert OneBitLamb(_model().parameters(), freeze_step=0.1, total_steps=1000, comm=comm).freeze_step == 100
    assert ZeroOneAdam(_model().parameters(), var_freeze_step=0.25, total_steps=10, comm=comm).var_freeze_step == 2
    with pytest.raises(ValueError, match="freeze_step=0.15 is a share of the run, so pass total_steps"):
        OneBitAdam(_model().parameters(), freeze_step=0.15, comm=comm)
    with pytest.raises(ValueError, match="freeze_step must come to at least 1 step"):
        OneBitLamb(_model().parameters(), freeze_step=0.01, total_steps=20, comm=comm)
    with pytest.raises(ValueError, match="a number of steps or a share of the run"):
        OneBitAdam(_model().parameters(), freeze_step=2.5, comm=comm)
    with pytest.raises(ValueError, match="freeze_step must come to at least 0"):
        OneBitAdam(_model().parameters(), freeze_step=-1, comm=comm)


@pytest.mark.parametrize("cls", ALL)
def test_checkpoints_of_another_model_are_refused_of_another_rank_loaded(cls) -> None:
    """Another algorithm's or model's state: ValueError. Another rank's or world's: all but the error buffers, which
    restart at zero with a warning."""
    comm = compcoll.SingleComm()
    model = _model()
    opt = cls(model.parameters(), comm=comm, **({"freeze_step": 0} if cls in (OneBitAdam,) else {}))
    for _ in range(2):
        model(torch.randn(4, 5)).sum().backward()
        opt.step()
    state = opt.state_dict()
    section = state["param_groups"][0]["compcoll"]
    other_world = {"state": state["state"], "param_groups": [
        {**state["param_groups"][0], "compcoll": {**{k: v for k, v in section.items() if k != "rank0"},
                                                  "world_size": 2, "rank1": section["rank0"]}}]}
    fresh = cls(_model().parameters(), comm=comm)
    with pytest.warns(UserWarning,
                      match="on rank 0 of 1: counters resume exactly, but .* an exact resume needs the world size"):
        fresh.load_state_dict(other_world)
    if opt._channel is not None:
        assert all(not bool(t.any()) for t in _tensors(fresh.channel.state_dict()))
    loaded, saved = whole_state(fresh), whole_state(opt, state)
    assert loaded["steps"] == 2 and loaded["scalars"] == saved["scalars"]
    assert all(torch.equal(loaded["buffers"][k], v) for k, v in saved["buffers"].items())
    with pytest.raises(ValueError, match="other parameter groups or shapes"):
        cls(torch.nn.Linear(5, 4).parameters(), comm=comm).load_state_dict(state)
    other = next(c for c in ALL if c is not cls)
    with pytest.raises(ValueError, match=cls.__name__):
        other(_model().parameters(), comm=comm).load_state_dict(state)


def test_hyperparameters_restored() -> None:
    comm = compcoll.SingleComm()
    model = torch.nn.Sequential(torch.nn.Linear(5, 4), torch.nn.Linear(4, 2))
    opt = OneBitAdam([{"params": model[0].parameters()}, {"params": model[1].parameters(), "lr": 0.5}], comm=comm)
    state = opt.state_dict()
    opt.param_groups[1]["lr"] = 0.1
    opt.load_state_dict(state)
    assert opt.param_groups[1]["lr"] == 0.5 and opt.param_groups[0]["lr"] == 1e-3
    assert opt.synchronized


ALL_NAMES = ["OneBitAdam", "OneBitAdam bc", "OneBitLamb", "OneBitLamb layers", "OneBitLamb frozen", "ZeroOneAdam",
             "Birder"]


@pytest.mark.parametrize("world_size, backend, names", [
    (1, "threads", ALL_NAMES), (3, "threads", ALL_NAMES), (2, "mpi", ALL_NAMES),
    (2, "gloo", ["OneBitLamb layers", "Birder"])])
def test_a_group_added_in_the_warmup_trains_as_if_there_from_the_start(world_size: int, backend: str,
                                                                       names: list[str]) -> None:
    run("tests.optim.base_workers:grown_equals_built_with_every_group", world_size, backend, args=(names,))


@pytest.mark.parametrize("world_size, backend", [(2, "threads"), (3, "mpi"), (2, "gloo")])
def test_a_group_added_out_of_turn_raises_on_every_rank(world_size: int, backend: str) -> None:
    run("tests.optim.base_workers:growth_refused_everywhere", world_size, backend)
