"""Rank-side bodies of the saved-state tests: torch.distributed.checkpoint over real Gloo ranks."""

from __future__ import annotations

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

import compcoll
from tests.optim.optim_workers import STEPS, build, flat_params, train


def distributed_checkpoint_resumes_exactly(comm: compcoll.Communicator, name: str, at: int, directory: str) -> None:
    """torch's distributed checkpoint: ``get_state_dict`` after ``zero_grad()`` at step ``at`` takes no step (it
    took one with zero gradients, counted as a step here, then failed with KeyError 'algorithm'), names the state by
    the parameters' names, ``dcp.save`` / ``dcp.load`` keep each rank's own error feedback apart, and a fresh model
    and optimizer resumed through ``set_state_dict`` end with the bits of the uninterrupted run."""
    model, opt = build(comm, name)
    train(comm, model, opt, range(at))
    opt.synchronize()  # 0/1 Adam between syncs: one copy of the model, as a checkpoint of replicas wants
    opt.zero_grad()
    steps = opt.steps
    model_state, opt_state = get_state_dict(model, opt)
    assert opt.steps == steps, f"get_state_dict took a step ({steps} -> {opt.steps})"
    names = {key for key, _ in model.named_parameters()}
    assert set(opt_state["state"]) == names and all("exp_avg" in s or "live" in s for s in opt_state["state"].values())
    dcp.save({"model": model_state, "optim": opt_state}, checkpoint_id=directory)
    train(comm, model, opt, range(at, STEPS))

    model2, opt2 = build(comm, name)
    model_state, opt_state = get_state_dict(model2, opt2)
    assert opt2.steps == 0, "get_state_dict took a step on a fresh optimizer"
    loaded = {"model": model_state, "optim": opt_state}
    dcp.load(loaded, checkpoint_id=directory)
    set_state_dict(model2, opt2, model_state_dict=loaded["model"], optim_state_dict=loaded["optim"])
    assert opt2.steps == steps
    train(comm, model2, opt2, range(at, STEPS))
    assert torch.equal(flat_params(model2).view(torch.int32), flat_params(model).view(torch.int32)), \
        f"{name} resumed through torch.distributed.checkpoint at step {at} differs from the uninterrupted run"
