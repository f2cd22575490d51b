"""Rank-side bodies of the tests that checkpoints DeepSpeed 0.19.6 wrote resume in compcoll's optimizers."""

from __future__ import annotations

import sys
from pathlib import Path

import torch

import compcoll
from compcoll.launcher import seeded
from compcoll.optim import OneBitAdam, from_deepspeed_config, load_deepspeed_checkpoint
from tests.algorithms.onebit_workers import assert_same_on_all_ranks
from tests.optim.optim_workers import Net, batch, whole_state

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
    theirs = _deepspeed_trained(comm, folder, CONFIG)
    _resumed_alike(comm, folder, CONFIG, "compcoll", theirs, ("exp_avg", "exp_avg_sq"), {}, {})


ZERO_ONE_CONFIG = {**CONFIG, "optimizer": {"type": "ZeroOneAdam", "params": {
    "lr": 1e-2, "var_freeze_step": 3, "var_update_scaler": 2, "local_step_scaler": 2, "local_step_clipper": 4,
    "comm_backend_name": "compressed"}}}
"""DeepSpeed's ZeroOneAdam on the same two ranks and backend: past its variance phase by ``SAVED_AT``, its
synchronisation interval doubled once."""


def resume_deepspeed_zero_one_checkpoint(comm: compcoll.Communicator, folder: str) -> None:
    """``resume_deepspeed_checkpoint`` for 0/1 Adam: every parameter's moments are DeepSpeed's, its variance and
    synchronisation intervals and counters DeepSpeed's, and ``AFTER`` more steps equal those of a ZeroOneAdam given
    the same state through its own ``load_state_dict``."""
    theirs = _deepspeed_trained(comm, folder, ZERO_ONE_CONFIG)
    schedule = {"var_interval": theirs[0]["var_interval"], "var_counter": theirs[0]["var_counter"],
                "local_interval": theirs[0]["local_step_interval"],
                "local_counter": theirs[0]["local_step_counter"], "pending": 0}
    assert schedule["local_interval"] == 2 and schedule["var_interval"] > 1, schedule
    _resumed_alike(comm, folder, ZERO_ONE_CONFIG, "compcoll", theirs, ("exp_avg", "exp_avg_sq"), {}, schedule)


def _deepspeed_trained(comm: compcoll.Communicator, folder: str, config: dict) -> list[dict]:
    """Step 1: DeepSpeed's engine trains ``SAVED_AT`` steps under ``config`` and saves into ``folder``; each
    parameter's optimizer state, copied."""
    deepspeed = _deepspeed()
    with seeded(0):
        model = Net()
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)
    for step in range(SAVED_AT):
        engine.backward(_loss(engine, comm.rank, step))
        engine.step()
    engine.save_checkpoint(folder, tag="saved")
    theirs = [{k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in engine.optimizer.state[p].items()}
              for p in model.parameters()]
    comm.barrier()
    return theirs


def _resumed_alike(comm: compcoll.Communicator, folder: str, config: dict, numerics: str, theirs: list[dict],
                   moments: tuple[str, ...], floats: dict[str, str], scalars: dict) -> None:
    """Steps 2-3: compcoll's optimizer built from ``config`` loads the checkpoint: its ``moments`` and the per-layer
    buffers named by ``floats`` (DeepSpeed's key -> attribute) hold DeepSpeed's values, its steps DeepSpeed's; then
    ``AFTER`` steps equal those of one given the same state (and ``scalars``) through ``load_state_dict``."""
    with seeded(1):
        ours_model, ref_model = Net(), Net()
    ours = from_deepspeed_config(config, ours_model.parameters(), comm, numerics=numerics)
    loaded = load_deepspeed_checkpoint(ours, folder)
    ours_model.load_state_dict(loaded["module"])
    for (segment, _), entry in zip(ours.flat.views(ours.exp_avg), theirs):
        for key in moments:
            got = getattr(ours, key)[segment.start:segment.stop]
            assert torch.equal(got, entry[key].reshape(-1)), f"rank {comm.rank}: {key}"
    for key, attribute in floats.items():
        assert getattr(ours, attribute).tolist() == [float(entry[key]) for entry in theirs], key
    assert ours.steps == theirs[0]["step"] == SAVED_AT
    assert ours.compressing if hasattr(ours, "compressing") else ours.steps > ours.var_freeze_step
    if hasattr(ours, "var_interval"):
        assert whole_state(ours)["scalars"] == scalars, (whole_state(ours)["scalars"], scalars)

    ref_model.load_state_dict(loaded["module"])
    start = ours.flat.data.clone()
    ref = from_deepspeed_config(config, ref_model.parameters(), comm, numerics=numerics)
    state = whole_state(ref)  # given as before 2026-11-30: the whole state under "state"
    state.update(buffers={key: value.clone() for key, value in whole_state(ours)["buffers"].items()},
                 scalars=scalars, steps=SAVED_AT)
    groups = [{k: v for k, v in group.items() if k != "compcoll"} for group in ref.state_dict()["param_groups"]]
    ref.load_state_dict({"state": state, "param_groups": groups})
    for step in range(SAVED_AT, SAVED_AT + AFTER):
        for model_, opt in ((ours_model, ours), (ref_model, ref)):
            opt.zero_grad()
            _loss(model_, comm.rank, step).backward()
            opt.step()
    for opt in (ours, ref):
        opt.synchronize()  # 0/1 Adam: its local steps since the last synchronisation; the others: nothing
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


LAMB_CONFIG = {**CONFIG, "optimizer": {"type": "OneBitLamb", "params": {"lr": 1e-2, "freeze_step": 3,
                                                                        "comm_backend_name": "compressed"}}}
"""DeepSpeed's OnebitLamb on the same two ranks and backend."""


def resume_deepspeed_lamb_checkpoint(comm: compcoll.Communicator, folder: str) -> None:
    """``resume_deepspeed_checkpoint`` for 1-bit LAMB, with DeepSpeed's numerics (its momentum scaling and frozen
    trust ratios, which read the carried floats): every parameter's three moments and its lamb_coeff_freeze,
    last_factor and scaling_coeff are DeepSpeed's, and ``AFTER`` more steps equal those of a OneBitLamb given the
    same state through its own ``load_state_dict``."""
    theirs = _deepspeed_trained(comm, folder, LAMB_CONFIG)
    _resumed_alike(comm, folder, LAMB_CONFIG, "deepspeed", theirs, ("exp_avg", "exp_avg_sq", "exp_avg_sq_fresh"),
                   {"lamb_coeff_freeze": "coeff_freeze", "last_factor": "last_factor",
                    "scaling_coeff": "scaling_coeff"}, {"scaled": True})
