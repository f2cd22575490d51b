"""Rank-side bodies of the saved-state tests: torch.distributed.checkpoint over real Gloo ranks."""

from __future__ import annotations

import warnings

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

import compcoll
import compcoll.checkpoint
from compcoll.optim.dcp import ElasticLoadPlanner
from tests.optim.optim_workers import STEPS, build, flat_params, train


def distributed_checkpoint_resumes_exactly(comm: compcoll.Communicator, name: str, at: int, directory: str,
                                           elastic: bool) -> None:
    """torch's distributed checkpoint: ``get_state_dict`` after ``zero_grad()`` at step ``at`` takes no step (it
    took one with zero gradients, counted as a step here, then failed with KeyError 'algorithm'), names the state by
    the parameters' names, ``dcp.save`` / ``dcp.load`` keep each rank's own error feedback apart, and a fresh model
    and optimizer resumed through ``set_state_dict`` end with the bits of the uninterrupted run, loaded by the default
    planner or (``elastic``) by ``ElasticLoadPlanner``."""
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
    dcp.load(loaded, checkpoint_id=directory, planner=ElasticLoadPlanner() if elastic else None)
    set_state_dict(model2, opt2, model_state_dict=loaded["model"], optim_state_dict=loaded["optim"])
    assert opt2.steps == steps
    train(comm, model2, opt2, range(at, STEPS))
    assert torch.equal(flat_params(model2).view(torch.int32), flat_params(model).view(torch.int32)), \
        f"{name} resumed through torch.distributed.checkpoint at step {at} differs from the uninterrupted run"


def _to_save(model: torch.nn.Module, opt: compcoll.optim.CompressedOptimizer, listed: bool) -> dict:
    """What ``dcp.save`` / ``dcp.load`` take: the model's and optimizer's states, the latter in a list if ``listed``."""
    model_state, opt_state = get_state_dict(model, opt)
    return {"model": model_state, "optim": [opt_state] if listed else opt_state}


def saved_for_another_world(comm: compcoll.Communicator, name: str, at: int, directory: str, listed: bool) -> None:
    """Train ``at`` steps, then save the model and optimizer through ``dcp.save`` (``directory/dcp``) and the
    optimizer's per-rank files through ``compcoll.checkpoint.save`` (``directory/files``)."""
    model, opt = build(comm, name)
    train(comm, model, opt, range(at))
    opt.synchronize()
    opt.zero_grad()
    dcp.save(_to_save(model, opt, listed), checkpoint_id=f"{directory}/dcp")
    compcoll.checkpoint.save(f"{directory}/files", opt)


def resumed_on_another_world(comm: compcoll.Communicator, name: str, at: int, directory: str, listed: bool,
                             saved_by: int) -> None:
    """A checkpoint of ``saved_for_another_world`` by ``saved_by`` ranks loaded by a world of another size:
    ``dcp.load`` with ``ElasticLoadPlanner`` resumes (the default planner raises on every rank where this world is
    larger), with one warning a rank, and trains on with the bits of the same optimizer loaded through
    ``compcoll.checkpoint.load`` (rank r takes saved rank r % m's own part either way), its replicas identical."""
    model, opt = build(comm, name)
    loaded = _to_save(model, opt, listed)
    if comm.size > saved_by:
        try:
            dcp.load(loaded, checkpoint_id=f"{directory}/dcp")
        except CheckpointException as exc:
            assert "Missing key in checkpoint state_dict" in str(exc) and ".compcoll.rank" in str(exc), exc
        else:
            raise AssertionError("the default planner loaded a smaller world's optimizer state")
        loaded = _to_save(model, opt, listed)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        dcp.load(loaded, checkpoint_id=f"{directory}/dcp", planner=ElasticLoadPlanner())
        opt_state = loaded["optim"][0] if listed else loaded["optim"]
        set_state_dict(model, opt, model_state_dict=loaded["model"], optim_state_dict=opt_state)
    mine = [str(w.message) for w in caught if str(w.message).startswith(f"{name}: loaded the state of rank")]
    assert len(mine) == 1 and f"rank {comm.rank % saved_by} of {saved_by} on rank {comm.rank}" in mine[0], \
        [str(w.message) for w in caught]

    model2, opt2 = build(comm, name)
    model2.load_state_dict(model.state_dict())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        compcoll.checkpoint.load(f"{directory}/files", opt2)
    assert opt.steps == opt2.steps == at, (opt.steps, opt2.steps)
    train(comm, model, opt, range(at, STEPS))
    train(comm, model2, opt2, range(at, STEPS))
    assert torch.equal(flat_params(model).view(torch.int32), flat_params(model2).view(torch.int32)), \
        f"{name} resumed through dcp on {comm.size} ranks differs from compcoll.checkpoint's resume"
