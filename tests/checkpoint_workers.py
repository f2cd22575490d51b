"""Rank-side bodies of the checkpoint tests: per-rank files through compcoll.checkpoint, rank 0's state everywhere."""

from __future__ import annotations

import warnings
from pathlib import Path

import torch

import compcoll
import compcoll.checkpoint
from tests.optim.optim_workers import STEPS, _tensors, build, flat_params, train, whole_state
from tests.warned import warned


def per_rank_files_resume_exactly(comm: compcoll.Communicator, name: str, at: int, directory: str) -> None:
    """compcoll.checkpoint.save at step ``at``, then load into a fresh model and optimizer: the run continues with
    the bits of the uninterrupted one."""
    model, opt = build(comm, name)
    train(comm, model, opt, range(at))
    weights = {k: v.clone() for k, v in model.state_dict().items()}
    path = compcoll.checkpoint.save(directory, opt)
    assert path == Path(directory) / f"compcoll-rank{comm.rank}-of-{comm.size}.pt" and path.exists()
    train(comm, model, opt, range(at, STEPS))
    model2, opt2 = build(comm, name)
    model2.load_state_dict(weights)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        compcoll.checkpoint.load(directory, opt2)
        train(comm, model2, opt2, range(at, STEPS))
    assert torch.equal(flat_params(model2).view(torch.int32), flat_params(model).view(torch.int32)), \
        f"{name} resumed from per-rank files at step {at} differs from the uninterrupted run"


def rank_zero_state_on_every_rank(comm: compcoll.Communicator, name: str, at: int, directory: str) -> None:
    """What frameworks do: rank 0 saves ``opt.state_dict()``, every rank loads it. Moments and counters resume;
    other ranks warn and restart their error buffers at zero; replicas stay identical; where the error buffers
    are still zero (warmup), the run continues with the uninterrupted run's bits."""
    model, opt = build(comm, name)
    train(comm, model, opt, range(at))
    file = Path(directory) / "optimizer.pt"
    if comm.rank == 0:
        torch.save({"model": model.state_dict(), "optimizer": opt.state_dict()}, file)
    comm.barrier()
    train(comm, model, opt, range(at, STEPS))
    saved = torch.load(file, weights_only=True)
    model2, opt2 = build(comm, name)
    model2.load_state_dict(saved["model"])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        opt2.load_state_dict(saved["optimizer"])
    per_rank = opt2._channel is not None or bool(opt2._rank_own)
    warned = [w for w in caught if "for an exact resume save and load every rank's state" in str(w.message)]
    assert len(warned) == (1 if comm.rank and per_rank else 0), [str(w.message) for w in caught]
    assert opt2.steps == at
    train(comm, model2, opt2, range(at, STEPS))  # asserts identical replicas after every synchronised step
    errors = _tensors(whole_state(opt2, saved["optimizer"])["error_feedback"])
    if not opt2._rank_own and not any(bool(t.any()) for t in errors):
        assert torch.equal(flat_params(model2), flat_params(model)), f"{name} resumed in warmup differs"


def a_missing_file_fails_every_rank(comm: compcoll.Communicator, directory: str, damage: str = "missing") -> None:
    """The last rank's file is gone (``damage`` "missing"), or holds bytes torch cannot read ("garbage"): that rank
    raises FileNotFoundError or ValueError naming its file, the others RemoteError naming it too, and no optimizer
    changed."""
    model, opt = build(comm, "OneBitAdam")
    train(comm, model, opt, range(6))
    compcoll.checkpoint.save(directory, opt)
    name = f"compcoll-rank{comm.size - 1}-of-{comm.size}.pt"
    if comm.rank == comm.size - 1:
        path = compcoll.checkpoint.path_of(directory, comm.rank, comm.size)
        if damage == "missing":
            path.unlink()
        else:
            path.write_bytes(b"not a checkpoint")
    comm.barrier()
    model2, opt2 = build(comm, "OneBitAdam")
    expected = FileNotFoundError if damage == "missing" else ValueError
    try:
        compcoll.checkpoint.load(directory, opt2)
    except expected as exc:
        assert comm.rank == comm.size - 1 and name in str(exc), exc
        assert damage == "missing" or "is not a whole checkpoint file of compcoll.checkpoint.save" in str(exc), exc
    except compcoll.RemoteError as exc:
        assert comm.rank != comm.size - 1 and comm.size - 1 in exc.failures and name in str(exc), exc
    else:
        raise AssertionError(f"rank {comm.rank} loaded without its peer's file")
    assert opt2.steps == 0


def save_every_rank(comm: compcoll.Communicator, name: str, at: int, directory: str) -> None:
    """Train ``at`` steps, then save rank 0's model and every rank's file (``compcoll.checkpoint.save``): the first
    half of an elastic restart."""
    model, opt = build(comm, name)
    train(comm, model, opt, range(at))
    if comm.rank == 0:
        torch.save(model.state_dict(), Path(directory) / "model.pt")
    compcoll.checkpoint.save(directory, opt)


def resume_on_another_world_size(comm: compcoll.Communicator, name: str, at: int, directory: str, saved_size: int
                                 ) -> None:
    """An elastic restart: a world of another size loads the files ``save_every_rank`` wrote. Each rank loads the
    file of rank ``rank % saved_size`` (moments, counters and, for Birder, that rank's local moments exactly), warns
    once that its error buffers restart at zero, and the replicas train on identically."""
    model, opt = build(comm, name)
    model.load_state_dict(torch.load(Path(directory) / "model.pt", weights_only=True))
    said = warned(compcoll.checkpoint.load, directory, opt)
    expected = (f"loaded the state of rank {comm.rank % saved_size} of {saved_size} on rank {comm.rank} of {comm.size}"
                f": counters resume exactly")
    assert len(said) == 1 and expected in said[0] and "needs the world size that saved it" in said[0], said
    source = compcoll.checkpoint.path_of(directory, comm.rank % saved_size, saved_size)
    saved = whole_state(opt, torch.load(source, weights_only=True)[0])
    loaded = whole_state(opt)
    assert opt.steps == at and loaded["steps"] == saved["steps"]
    for key, value in saved["buffers"].items():
        assert torch.equal(loaded["buffers"][key], value), f"{name}: buffer {key} not loaded"
    assert not any(bool(t.any()) for t in _tensors(loaded.get("error_feedback"))), "error feedback did not restart"
    train(comm, model, opt, range(at, STEPS))  # asserts identical replicas after every synchronised step
    assert opt.steps == STEPS
