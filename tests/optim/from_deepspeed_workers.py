"""Rank-side body of the test that a checkpoint DeepSpeed 0.19.6 wrote resumes in compcoll's OneBitAdam."""

from __future__ import annotations

import sys
from pathlib import Path

import torch

import compcoll
from compcoll.launcher import seeded
from compcoll.optim import OneBitAdam, from_deepspeed_config, load_deepspeed_checkpoint
from tests.algorithms.onebit_workers import assert_same_on_all_ranks
from tests.optim.optim_workers import Net, batch

ROOT = Path(__file__).resolve().parents[2]
CONFIG = {"train_batch_size": 16, "train_micro_batch_size_per_gpu": 8, "gradient_clipping": 0.0,
          "optimizer": {"type": "OneBitAdam", "params": {"lr": 1e-2, "freeze_step": 3,
                                                         "comm_backend_name": "compressed"}}}
"""Two ranks; DeepSpeed's torch.distributed 1-bit backend ("compressed"), the one that runs on CPU."""
SAVED_AT, AFTER = 6, 4
"""Steps DeepSpeed takes before it saves (past freeze_step: compression), then steps compcoll takes after."""


def _loss(model: torch.nn.Module, rank: int, step: int) -> torch.Tensor:
    tokens, x, y = batch(rank, step)
    return torch.nn.functional.cross_entropy(model(tokens, x), y)


def _deepspeed():
    """deepspeed 0.19.6 with bench/peers' CPU shims installed, on this rank's torch.distributed group."""
    sys.path.insert(0, str(ROOT / "bench" / "peers"))
    import deepspeed_shim

    return deepspeed_shim.load()


def resume_deepspeed_checkpoint(comm: compcoll.Communicator, folder: str) -> None:
    """1. DeepSpeed's engine (its own OnebitAdam, bench/peers' CPU shims) trains ``SAVED_AT``
          steps and saves a checkpoint.
       2. compcoll's OneBitAdam, built from the same config on a model that loads the
          checkpoint's weights, loads its optimizer state: every parameter's exp_avg and
          exp_avg_sq are DeepSpeed's bits, and the step count is DeepSpeed's.
       3. ``AFTER`` more steps equal, bit for bit, those of a second OneBitAdam given the
          same weights, moments and step through compcoll's own ``load_state_dict``; every
          rank ends with the same bits.
    """
    deepspeed = _deepspeed()
    with seeded(0):
        model = Net()
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=CONFIG)
    for step in range(SAVED_AT):
        engine.backward(_loss(engine, comm.rank, step))
        engine.step()
    engine.save_checkpoint(folder, tag="saved")
    theirs = {i: {k: v.clone() for k, v in s.items() if isinstance(v, torch.Tensor)} | {"step": s["step"]}
              for i, s in enumerate(engine.optimizer.state[p] for p in model.parameters())}
    comm.barrier()

    with seeded(1):
        ours_model, ref_model = Net(), Net()
    ours = from_deepspeed_config(CONFIG, ours_model.parameters(), comm)
    loaded = load_deepspeed_checkpoint(ours, folder)
    ours_model.load_state_dict(loaded["module"])
    for (segment, _), i in zip(ours.flat.views(ours.exp_avg), theirs):
        for key in ("exp_avg", "exp_avg_sq"):
            got = getattr(ours, key)[segment.start:segment.stop]
            assert torch.equal(got, theirs[i][key].reshape(-1)), f"rank {comm.rank}: parameter {i}'s {key}"
    assert ours.steps == theirs[0]["step"] == SAVED_AT and ours.compressing

    ref_model.load_state_dict(loaded["module"])
    start = ours.flat.data.clone()
    ref = from_deepspeed_config(CONFIG, ref_model.parameters(), comm)
    state = ref.state_dict()
    state["state"]["buffers"] = {"exp_avg": ours.exp_avg.clone(), "exp_avg_sq": ours.exp_avg_sq.clone()}
    state["state"]["steps"] = SAVED_AT
    ref.load_state_dict(state)
    for step in range(SAVED_AT, SAVED_AT + AFTER):
        for model_, opt in ((ours_model, ours), (ref_model, ref)):
            opt.zero_grad()
            _loss(model_, comm.rank, step).backward()
            opt.step()
    assert torch.equal(ours.flat.data, ref.flat.data) and torch.equal(ours.exp_avg, ref.exp_avg)
    assert not torch.equal(ours.flat.data, start), "the steps after the load changed nothing"
    assert_same_on_all_ranks(comm, ours.flat.data)


def engine_recipe(comm: compcoll.Communicator) -> None:
    """The DeepSpeed guide's recipe: compcoll's OneBitAdam as DeepSpeed's client optimizer with the engine's gradient
    allreduce off trains, step for step, bit for bit as the optimizer does with no engine around it."""
    deepspeed = _deepspeed()
    runs = []
    for engine_on in (True, False):
        with seeded(0):
            model = Net()
        opt = OneBitAdam(model.parameters(), lr=1e-2, freeze_step=3, comm=comm)
        if engine_on:
            engine, *_ = deepspeed.initialize(model=model, optimizer=opt, config={
                "train_batch_size": 16, "train_micro_batch_size_per_gpu": 8, "gradient_clipping": 0.0})
            engine.enable_backward_allreduce = False
        for step in range(SAVED_AT):
            if engine_on:
                engine.backward(_loss(engine, comm.rank, step))
                engine.step()
            else:
                opt.zero_grad()
                _loss(model, comm.rank, step).backward()
                opt.step()
        runs.append(opt.flat.data.clone())
    assert torch.equal(runs[0], runs[1]), "under the engine the steps differ from the optimizer's own"
    assert_same_on_all_ranks(comm, runs[0])
