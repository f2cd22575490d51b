"""DeepSpeed 0.19.6's tutorial configs build compcoll's optimizers; its OneBitAdam checkpoints load into them."""

from __future__ import annotations

import argparse
import json
import logging
from pathlib import Path

import pytest
import torch

import compcoll
from compcoll.launcher import run
from compcoll.optim import (Birder, OneBitAdam, OneBitLamb, ZeroOneAdam, from_deepspeed_config,
                            load_deepspeed_checkpoint)
from tests.optim.optim_workers import Net

TUTORIALS = {
    "OneBitAdam": {
        "train_batch_size": 4096, "train_micro_batch_size_per_gpu": 16,
        "optimizer": {"type": "OneBitAdam", "params": {"lr": 4e-4, "freeze_step": 23000, "cuda_aware": False,
                                                       "comm_backend_name": "nccl"}},
        "gradient_clipping": 1.0,
        "fp16": {"enabled": True, "loss_scale": 0, "initial_scale_power": 16}},
    "OneBitLamb": {
        "train_batch_size": 65536, "train_micro_batch_size_per_gpu": 64,
        "optimizer": {"type": "OneBitLamb", "params": {"lr": 11e-3, "max_coeff": 0.3, "min_coeff": 0.01,
                                                       "freeze_step": 1000, "cuda_aware": False,
                                                       "comm_backend_name": "nccl", "coeff_beta": 0.9,
                                                       "factor_max": 4.0, "factor_min": 0.5,
                                                       "factor_threshold": 0.1}},
        "gradient_clipping": 1.0,
        "fp16": {"enabled": True, "loss_scale": 0, "initial_scale_power": 16}},
    "ZeroOneAdam": {
        "train_batch_size": 4096, "train_micro_batch_size_per_gpu": 16,
        "optimizer": {"type": "ZeroOneAdam", "params": {"lr": 1e-3, "weight_decay": 0.01, "bias_correction": False,
                                                        "var_freeze_step": 1000, "var_update_scaler": 16,
                                                        "local_step_scaler": 1000, "local_step_clipper": 16,
                                                        "cuda_aware": False, "comm_backend_name": "nccl"}},
        "gradient_clipping": 1.0,
        "fp16": {"enabled": True, "loss_scale": 0, "initial_scale_power": 16}},
}
"""The configs of DeepSpeed's 1-bit Adam, 0/1 Adam and 1-bit LAMB tutorials (deepspeed.ai/tutorials), unchanged."""
CLASSES = {"OneBitAdam": OneBitAdam, "OneBitLamb": OneBitLamb, "ZeroOneAdam": ZeroOneAdam}


@pytest.mark.parametrize("name", list(TUTORIALS))
def test_tutorial_configs_build_their_optimizers_with_every_setting(name: str, tmp_path: Path, caplog) -> None:
    """Each tutorial's config, as a dict and as its JSON file: its class, each params value in place, a note for
    each key compcoll does not need and for each engine key that falls to the training loop."""
    path = tmp_path / "ds_config.json"
    path.write_text(json.dumps(TUTORIALS[name]))
    params = TUTORIALS[name]["optimizer"]["params"]
    for config in (TUTORIALS[name], str(path)):
        caplog.clear()
        with caplog.at_level(logging.INFO, logger="compcoll.optim.from_deepspeed"):
            opt = from_deepspeed_config(config, Net().parameters(), compcoll.SingleComm())
        assert type(opt) is CLASSES[name]
        group = opt.param_groups[0]
        for key, value in params.items():
            if key in ("lr", "weight_decay", "max_coeff", "min_coeff"):
                assert group[key] == value, key
            elif key not in ("cuda_aware", "comm_backend_name", "bias_correction"):
                assert getattr(opt, key) == value, key
        text = caplog.text
        for key in ("cuda_aware", "comm_backend_name", "gradient_clipping", "fp16"):
            assert f"{key}" in text, (key, text)
        assert f"built {name}(" in text and "compcoll's numerics" in text


def test_type_names_match_as_deepspeed_matches_them_and_numerics_can_be_deepspeeds() -> None:
    config = {"optimizer": {"type": "onebitLAMB", "params": {"freeze_step": 2}}}
    ours = from_deepspeed_config(config, Net().parameters(), compcoll.SingleComm())
    theirs = from_deepspeed_config(config, Net().parameters(), compcoll.SingleComm(), numerics="deepspeed",
                                   nonfinite="raise")
    assert type(ours) is type(theirs) is OneBitLamb
    assert (ours.compress, ours.trust_ratio) == ("update", "fresh")
    assert (theirs.compress, theirs.trust_ratio, theirs.nonfinite) == ("momentum", "frozen", "raise")
    assert (ours.channel.protocol, theirs.channel.protocol) == ("allgather", "gather_scatter")


@pytest.mark.parametrize("change, message", [
    ({"type": "Adam"}, "optimizer type 'Adam' is not one of DeepSpeed's 1-bit optimizers"),
    ({"params": {"freeze_step": 5, "max_grad_norm": 1.0}}, "'max_grad_norm' is not supported"),
    ({"params": {"freeze_step": 5, "amsgrad": True}}, "no AMSGrad variant"),
    ({"params": {"freeze_step": 5, "momentum": 0.9}}, "optimizer param 'momentum' is not one of OneBitAdam's"),
    ({"params": {"var_freeze_step": 5}}, "optimizer param 'var_freeze_step' is not one of OneBitAdam's"),
    ({"zero_optimization": {"stage": 1}}, "zero_optimization stage 1"),
    ({"options": {"lr": 0.1}}, "lr set both in the config and as keyword arguments"),
    ({"params": {"lr": "auto"}}, 'lr is "auto", which transformers\' Trainer fills in from its TrainingArguments; '
                                 "give the value: from_deepspeed_config(config, params, lr=...)"),
    ({"params": 5}, 'the optimizer\'s "params" must be an object of keys, got 5'),
])
def test_keys_that_would_change_the_numerics_are_refused_by_name(change: dict, message: str) -> None:
    config = {"optimizer": {"type": "OneBitAdam", "params": {"lr": 0.01, "freeze_step": 5}}}
    options = change.get("options", {})
    config["optimizer"].update({k: v for k, v in change.items() if k in ("type", "params")})
    config.update({k: v for k, v in change.items() if k not in ("type", "params", "options")})
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        from_deepspeed_config(config, Net().parameters(), compcoll.SingleComm(), **options)


def test_auto_values_take_the_keyword_arguments() -> None:
    """A config written for transformers' DeepSpeed integration: its "auto" values come from the keywords."""
    config = {"optimizer": {"type": "OneBitAdam", "params": {"lr": "auto", "betas": "auto", "eps": 1e-6,
                                                             "freeze_step": 3}}}
    opt = from_deepspeed_config(config, Net().parameters(), compcoll.SingleComm(), lr=2e-3, betas=(0.8, 0.9))
    group = opt.param_groups[0]
    assert (group["lr"], group["betas"], group["eps"], opt.freeze_step) == (2e-3, (0.8, 0.9), 1e-6, 3)


def _deepspeed_state(model: torch.nn.Module, step: int) -> dict:
    """An optimizer state laid out as DeepSpeed 0.19.6's OnebitAdam saves it (torch's: per parameter index)."""
    gen = torch.Generator().manual_seed(step)
    state = {i: {"step": step, "exp_avg": torch.randn(p.shape, generator=gen),
                 "exp_avg_sq": torch.rand(p.shape, generator=gen)} for i, p in enumerate(model.parameters())}
    return {"state": state, "param_groups": [{"params": list(state), "lr": 1e-3}]}


def test_checkpoint_moments_land_on_their_parameters_and_the_phase_follows_the_step(tmp_path: Path) -> None:
    """A OneBitAdam state in DeepSpeed's layout, from its model-states file: each parameter's moments land in its
    slice of the flat buffers, the step count sets the phase, the error buffers restart at zero."""
    model = Net()
    opt = OneBitAdam(model.parameters(), freeze_step=3, comm=compcoll.SingleComm())
    saved = _deepspeed_state(model, 4)
    path = tmp_path / "mp_rank_00_model_states.pt"
    torch.save({"module": model.state_dict(), "optimizer": saved, "ds_version": "0.19.6"}, path)
    loaded = load_deepspeed_checkpoint(opt, tmp_path)
    assert set(loaded["module"]) == set(model.state_dict())
    for (segment, _), i in zip(opt.flat.views(opt.exp_avg), range(len(saved["state"]))):
        for key in ("exp_avg", "exp_avg_sq"):
            got = getattr(opt, key)[segment.start:segment.stop]
            assert torch.equal(got, saved["state"][i][key].reshape(-1)), (i, key)
    assert opt.steps == 4 and opt.compressing


def _lamb_state(model: torch.nn.Module, step: int, scaled: bool) -> dict:
    """A state laid out as DeepSpeed 0.19.6's OnebitLamb saves it: OnebitAdam's, with exp_avg_sq_fresh and each
    parameter's lamb_coeff_freeze and last_factor, and scaling_coeff once its compression started (``scaled``)."""
    saved = _deepspeed_state(model, step)
    gen = torch.Generator().manual_seed(step + 1)
    for i, entry in saved["state"].items():
        entry["exp_avg_sq_fresh"] = torch.rand(entry["exp_avg"].shape, generator=gen)
        entry["lamb_coeff_freeze"], entry["last_factor"] = 0.5 + i / 7, 1.0 - i / 50
        if scaled:
            entry["scaling_coeff"] = 2.0 + i / 3
    return saved


def test_a_onebit_lamb_checkpoint_lands_its_moments_and_floats() -> None:
    """A OneBitLamb state in DeepSpeed's layout: the three moments in their slices, the per-parameter floats in the
    per-layer buffers, scaling_coeff marking the momentum scaled; one without scaling_coeff (saved in the warm-up)
    leaves it unscaled; floats missing, or scaling_coeff on some parameters only, refused with nothing changed."""
    model = Net()
    for scaled, step in ((True, 5), (False, 2)):
        opt = OneBitLamb(model.parameters(), freeze_step=3, comm=compcoll.SingleComm())
        saved = _lamb_state(model, step, scaled)
        load_deepspeed_checkpoint(opt, {"optimizer": saved})
        for (segment, _), i in zip(opt.flat.views(opt.exp_avg), saved["state"]):
            for key in ("exp_avg", "exp_avg_sq", "exp_avg_sq_fresh"):
                assert torch.equal(getattr(opt, key)[segment.start:segment.stop], saved["state"][i][key].reshape(-1))
        entries = list(saved["state"].values())
        assert opt.coeff_freeze.tolist() == [e["lamb_coeff_freeze"] for e in entries]
        assert opt.last_factor.tolist() == [e["last_factor"] for e in entries]
        assert opt.scaled == scaled and opt.steps == step and opt.compressing == scaled
        if scaled:
            assert opt.scaling_coeff.tolist() == [e["scaling_coeff"] for e in entries]
    opt = OneBitLamb(model.parameters(), freeze_step=3, comm=compcoll.SingleComm())
    for damage, message in ((lambda st: st[2].pop("last_factor"), "no last_factor for trained parameter 2"),
                            (lambda st: st[1].pop("scaling_coeff"), "scaling_coeff for some parameters and not")):
        saved = _lamb_state(model, 5, True)
        damage(saved["state"])
        with pytest.raises(ValueError, match=message):
            load_deepspeed_checkpoint(opt, {"optimizer": saved})
        assert opt.steps == 0 and not opt.exp_avg.any() and not opt.scaled


def test_a_checkpoint_that_does_not_fit_is_refused_and_changes_nothing(tmp_path: Path) -> None:
    model = Net()
    opt = OneBitAdam(model.parameters(), freeze_step=3, comm=compcoll.SingleComm())
    saved = _deepspeed_state(model, 4)
    saved["state"][1]["exp_avg"] = torch.zeros(7)
    with pytest.raises(ValueError, match=r"parameter 1's exp_avg is \(7,\)"):
        load_deepspeed_checkpoint(opt, {"optimizer": saved})
    assert opt.steps == 0 and not opt.exp_avg.any()
    saved = _deepspeed_state(model, 4)
    saved["param_groups"] = [{"params": [0]}, {"params": list(saved["state"])[1:]}]
    with pytest.raises(ValueError, match="parameter groups"):
        load_deepspeed_checkpoint(opt, {"optimizer": saved})
    with pytest.raises(ValueError, match="carries OneBitAdam's, OneBitLamb's and ZeroOneAdam's state; got Birder"):
        load_deepspeed_checkpoint(Birder(Net().parameters(), comm=compcoll.SingleComm()), {"optimizer": saved})


def _zero_one_state(model: torch.nn.Module, step: int, lrs: float) -> dict:
    """A ZeroOneAdam state laid out as DeepSpeed 0.19.6's saves it: the moments, its schedule's counters per
    parameter, and what its own load drops (error buffers, the accumulated momentum and its lr sum ``lrs``)."""
    saved = _deepspeed_state(model, step)
    for entry in saved["state"].values():
        entry.update(var_interval=4, var_counter=1, local_step_interval=2, local_step_counter=1, lrs=lrs,
                     momentum_accumulator=torch.ones_like(entry["exp_avg"]), worker_error=torch.ones(8),
                     server_error=torch.ones(8), tensor_size=entry["exp_avg"].numel())
    return saved


def test_a_zero_one_adam_checkpoint_lands_its_moments_and_schedule(caplog) -> None:
    """DeepSpeed's ZeroOneAdam state: each parameter's moments land in its slice, the step count and the variance and
    synchronisation intervals and counters are DeepSpeed's (its own load restarts them at 1 in a new process), the
    local steps since the last synchronisation start afresh (with a warning where DeepSpeed had some); counters
    that differ between parameters, or are missing, are refused by name with nothing changed."""
    model = Net()
    opt = ZeroOneAdam(model.parameters(), var_freeze_step=3, comm=compcoll.SingleComm())
    saved = _zero_one_state(model, 6, 0.0)
    bad = _zero_one_state(model, 6, 0.0)
    bad["state"][2]["var_interval"] = 8
    with pytest.raises(ValueError, match=r"parameters at different var_interval \[4, 8\]"):
        load_deepspeed_checkpoint(opt, {"optimizer": bad})
    del bad["state"][2]["var_interval"]
    with pytest.raises(ValueError, match="no var_interval for trained parameter 2"):
        load_deepspeed_checkpoint(opt, {"optimizer": bad})
    assert opt.steps == 0 and not opt.exp_avg.any() and opt.var_interval == 1
    with caplog.at_level(logging.INFO, logger="compcoll.optim.carry"):
        load_deepspeed_checkpoint(opt, {"optimizer": saved})
    for (segment, _), i in zip(opt.flat.views(opt.exp_avg), range(len(saved["state"]))):
        for key in ("exp_avg", "exp_avg_sq"):
            assert torch.equal(getattr(opt, key)[segment.start:segment.stop], saved["state"][i][key].reshape(-1))
    assert (opt.steps, opt.var_interval, opt.var_counter, opt.local_interval, opt.local_counter) == (6, 4, 1, 2, 1)
    assert opt.synchronized and "(local phase)" in caplog.text and "not carried" not in caplog.text

    for p in model.parameters():
        p.grad = torch.ones_like(p)
    opt.step()  # step 7: a local step, the next synchronisation at step 8 (interval 2)
    assert not opt.synchronized and opt.accumulator.any()
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="compcoll.optim.carry"):
        load_deepspeed_checkpoint(opt, {"optimizer": _zero_one_state(model, 6, 0.03)})
    assert opt.synchronized and not opt.accumulator.any() and not opt.lr_sums.any()
    assert "the local steps since 0/1 Adam's last synchronisation are not carried" in caplog.text


def test_a_file_that_needs_more_than_weights_is_refused_unless_named(tmp_path: Path) -> None:
    model = Net()
    opt = OneBitAdam(model.parameters(), freeze_step=3, comm=compcoll.SingleComm())
    path = tmp_path / "mp_rank_00_model_states.pt"
    torch.save({"optimizer": _deepspeed_state(model, 2), "args": argparse.Namespace(seed=1)}, path)
    with pytest.raises(ValueError, match="refused, since it needs more than tensors.*argparse.Namespace"):
        load_deepspeed_checkpoint(opt, path)
    assert opt.steps == 0
    assert load_deepspeed_checkpoint(opt, path, allow=("argparse.Namespace",))["args"].seed == 1
    assert opt.steps == 2 and not opt.compressing


def test_a_checkpoint_deepspeed_wrote_resumes_in_compcoll_on_two_gloo_ranks(tmp_path: Path) -> None:
    """DeepSpeed 0.19.6's engine trains OnebitAdam past its warmup on 2 Gloo ranks and saves; compcoll's OneBitAdam,
    built from the same config, loads it: moments and step bit for bit, and the next steps equal those of a
    OneBitAdam given the same state through its own ``load_state_dict``."""
    pytest.importorskip("deepspeed")
    run("tests.optim.from_deepspeed_workers:resume_deepspeed_checkpoint", 2, "gloo", args=(str(tmp_path),),
        timeout=300)


def test_a_onebit_lamb_checkpoint_deepspeed_wrote_resumes_in_compcoll_on_two_gloo_ranks(tmp_path: Path) -> None:
    """The same for DeepSpeed's OnebitLamb: three moments, and the per-parameter floats its frozen trust ratios and
    momentum scaling read, bit for bit; the next steps equal those of a OneBitLamb given the same state."""
    pytest.importorskip("deepspeed")
    run("tests.optim.from_deepspeed_workers:resume_deepspeed_lamb_checkpoint", 2, "gloo", args=(str(tmp_path),),
        timeout=300)


def test_a_zero_one_adam_checkpoint_deepspeed_wrote_resumes_in_compcoll_on_two_gloo_ranks(tmp_path: Path) -> None:
    """The same for DeepSpeed's ZeroOneAdam past its variance phase: moments, step and its schedule's intervals and
    counters bit for bit, and the next steps equal those of a ZeroOneAdam given the same state."""
    pytest.importorskip("deepspeed")
    run("tests.optim.from_deepspeed_workers:resume_deepspeed_zero_one_checkpoint", 2, "gloo", args=(str(tmp_path),),
        timeout=300)


def test_the_readme_engine_recipe_trains_as_the_optimizer_alone_on_two_gloo_ranks() -> None:
    pytest.importorskip("deepspeed")
    run("tests.optim.from_deepspeed_workers:engine_recipe", 2, "gloo", timeout=300)
