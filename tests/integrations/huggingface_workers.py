"""Rank-side bodies of the Hugging Face tests: compcoll's Trainer and Accelerate hook on Gloo ranks, tiny GPT-2."""

from __future__ import annotations

import codecs
import hashlib
import json
import os
import this
from pathlib import Path

import accelerate
import torch
import transformers

import compcoll
import compcoll.optim
from compcoll.integrations import huggingface
from compcoll.optim import OneBitAdam
from tests.warned import warned

STEPS = 60
CONTEXT = 32
OVERFLOW_STEPS = (3, 20)
"""The steps whose loss ``Overflowing`` makes infinite on rank 0: one in 1-bit Adam's warm-up, one compressing."""


class Bytes(torch.utils.data.Dataset):
    """Windows of CONTEXT bytes of the Zen of Python at seeded offsets (inputs and labels: the same bytes)."""

    def __init__(self, count: int, seed: int) -> None:
        text = torch.tensor(list(codecs.decode(this.s, "rot13").encode()))
        starts = torch.randint(0, len(text) - CONTEXT, (count,), generator=torch.Generator().manual_seed(seed))
        self.windows = [text[s:s + CONTEXT] for s in starts.tolist()]

    def __len__(self) -> int:
        return len(self.windows)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.windows[i], "labels": self.windows[i]}


def gpt2() -> transformers.GPT2LMHeadModel:
    """A 2-layer byte-level GPT-2 built from its config (no download), the same initial weights on every rank."""
    torch.manual_seed(0)
    config = transformers.GPT2Config(vocab_size=256, n_positions=CONTEXT, n_embd=64, n_layer=2, n_head=4)
    return transformers.GPT2LMHeadModel(config)


def digest(model: torch.nn.Module) -> str:
    """A hash of the parameters' bits."""
    hashed = hashlib.sha256()
    for p in model.parameters():
        hashed.update(p.detach().float().numpy().tobytes())
    return hashed.hexdigest()


class Overflowing(huggingface.Trainer):
    """compcoll's Trainer whose rank 0 training loss is infinite at OVERFLOW_STEPS: its gradient overflows alone."""

    def compute_loss(self, model: torch.nn.Module, inputs: dict, *args, **kwargs):
        loss = super().compute_loss(model, inputs, *args, **kwargs)
        if model.training and self.accelerator.process_index == 0 and self.state.global_step in OVERFLOW_STEPS:
            return loss * float("inf")
        return loss


def _trainer(cls: type, output_dir: str, optimizers=(None, None), **overrides) -> transformers.Trainer:
    """A Trainer of class ``cls`` over ``gpt2()`` for STEPS optimizer steps, checkpointing at half-way."""
    model = gpt2()
    if callable(optimizers[0]):
        optimizers = (optimizers[0](model), None)
    args = transformers.TrainingArguments(**{
        "output_dir": output_dir, "max_steps": STEPS, "per_device_train_batch_size": 8, "learning_rate": 1e-3,
        "seed": 0, "save_strategy": "steps", "save_steps": STEPS // 2, "logging_steps": 10, "report_to": [],
        "use_cpu": True, "dataloader_num_workers": 0, **overrides})
    return cls(model=model, args=args, train_dataset=Bytes(STEPS * 16, 1), eval_dataset=Bytes(64, 2),
               optimizers=optimizers)


def _record(output_dir: str, rank: int, name: str, trainer: transformers.Trainer, **extra) -> None:
    """Append this rank's eval loss and parameter digest of run ``name`` (and ``extra``) to output_dir/rank<r>.json."""
    path = Path(output_dir) / f"rank{rank}.json"
    results = json.loads(path.read_text()) if path.exists() else {}
    results[name] = {"loss": trainer.evaluate()["eval_loss"], "digest": digest(trainer.model), **extra}
    path.write_text(json.dumps(results))


def trainer_runs(comm: compcoll.Communicator, output_dir: str) -> None:
    """The Trainer's default AdamW, and switched to compcoll's Trainer from its half-way checkpoint; compcoll's
    Trainer with its defaults (AdamW becomes 1-bit Adam) and resumed from its half-way checkpoint; a 1-bit Adam
    passed in with gradient accumulation and bf16, and with the loss scaler fp16 gets on GPUs (torch's, from 2^16)
    while rank 0 alone overflows (``Overflowing``); SGD through onebit_hook, and resumed. Each rank records each
    run's eval loss and digest."""
    plain = _trainer(transformers.Trainer, f"{output_dir}/adamw")
    plain.train()
    _record(output_dir, comm.rank, "AdamW", plain)

    switched = _trainer(huggingface.Trainer, f"{output_dir}/switched")
    switched.train(resume_from_checkpoint=f"{output_dir}/adamw/checkpoint-{STEPS // 2}")
    opt = switched.optimizer.optimizer
    assert isinstance(opt, OneBitAdam) and opt.steps == STEPS and opt.compressing, (type(opt), opt.steps)
    _record(output_dir, comm.rank, "AdamW, switched to 1-bit Adam at 30", switched)

    onebit = _trainer(huggingface.Trainer, f"{output_dir}/default")
    onebit.train()
    opt = onebit.optimizer.optimizer
    assert isinstance(opt, OneBitAdam) and opt.compressing and opt.channel.worker_error.abs().sum() > 0
    assert onebit._hooked is onebit.model_wrapped, "local_hook not registered on the Trainer's DDP"
    _record(output_dir, comm.rank, "default", onebit)

    resumed = _trainer(huggingface.Trainer, f"{output_dir}/default")
    resumed.train(resume_from_checkpoint=f"{output_dir}/default/checkpoint-{STEPS // 2}")
    _record(output_dir, comm.rank, "default, resumed at 30", resumed)

    given = _trainer(huggingface.Trainer, f"{output_dir}/given",
                     optimizers=(lambda m: OneBitAdam(m.parameters(), lr=1e-3, freeze_step=0.15, total_steps=STEPS),
                                 None),
                     per_device_train_batch_size=4, gradient_accumulation_steps=2, bf16=True)
    given.train()
    _record(output_dir, comm.rank, "OneBitAdam given, accumulation 2, bf16", given)

    scaled = _trainer(Overflowing, f"{output_dir}/scaled",  # no clipping: on CPUs Accelerate clips unscaled
                      optimizers=(lambda m: OneBitAdam(m.parameters(), lr=1e-3, freeze_step=0.15, total_steps=STEPS),
                                  None), max_grad_norm=0)
    scaled.accelerator.scaler = torch.amp.GradScaler("cpu")  # fp16 makes one on GPUs only
    scaled.train()
    assert isinstance(scaled.accelerator.scaler, compcoll.optim.GradScaler), type(scaled.accelerator.scaler)
    assert scaled.optimizer.scaler is scaled.accelerator.scaler
    _record(output_dir, comm.rank, "OneBitAdam given, a loss scaler, rank 0 overflowing", scaled,
            scale=scaled.accelerator.scaler.get_scale(), skipped=scaled.optimizer.optimizer.skipped_steps)

    sgd = _trainer(huggingface.Trainer, f"{output_dir}/sgd", optim="sgd", learning_rate=0.5)
    sgd.train()
    assert sgd.hook_state is not None and sgd.hook_state.schedule.iteration == STEPS, sgd.hook_state.schedule
    _record(output_dir, comm.rank, "SGD, onebit_hook", sgd)
    resumed = _trainer(huggingface.Trainer, f"{output_dir}/sgd", optim="sgd", learning_rate=0.5)
    resumed.train(resume_from_checkpoint=f"{output_dir}/sgd/checkpoint-{STEPS // 2}")
    _record(output_dir, comm.rank, "SGD, onebit_hook, resumed at 30", resumed)


def _accelerated(optimizer: str):
    """A fresh Accelerator (accumulation 2, bf16), ``gpt2()`` and its optimizer through ``prepare``, and the hook."""
    import accelerate

    accelerate.state.AcceleratorState._reset_state(True)
    accelerator = accelerate.Accelerator(gradient_accumulation_steps=2, mixed_precision="bf16", cpu=True)
    model = gpt2()
    opt = (OneBitAdam(model.parameters(), lr=1e-3, freeze_step=4) if optimizer == "onebit_adam"
           else torch.optim.SGD(model.parameters(), lr=0.5, momentum=0.9))
    model, opt = accelerator.prepare(model, opt)
    return accelerator, model, opt, huggingface.register_hook(model, opt, accelerator)


def _micro_steps(accelerator, model, opt, comm: compcoll.Communicator, steps: range) -> None:
    """Micro-batches ``steps`` (8 windows each, this rank's own) under ``accelerator.accumulate``."""
    data = Bytes(8 * 2 * 24, 3)
    for step in steps:
        batch = torch.stack([data[(step * 2 + comm.rank) * 8 + i]["input_ids"] for i in range(8)])
        with accelerator.accumulate(model):
            accelerator.backward(model(input_ids=batch, labels=batch).loss)
            opt.step()
            opt.zero_grad()


def accelerate_runs(comm: compcoll.Communicator, output_dir: str) -> None:
    """Accelerate with ``register_hook``: 1-bit Adam (local_hook) for 24 micro-batches, saved at 12 through
    ``accelerator.save_state`` and ``compcoll.checkpoint.save``, and a fresh run loaded from there; then SGD through
    onebit_hook. Each rank records the digests."""
    results = {}
    accelerator, model, opt, state = _accelerated("onebit_adam")
    assert state is None
    _micro_steps(accelerator, model, opt, comm, range(12))
    accelerator.save_state(f"{output_dir}/half")  # safetensors: every parameter, GPT-2's tied wte and lm_head too
    compcoll.checkpoint.save(f"{output_dir}/half", opt.optimizer)
    _micro_steps(accelerator, model, opt, comm, range(12, 24))
    assert opt.optimizer.steps == 12 and opt.optimizer.compressing, opt.optimizer.steps
    results["1-bit Adam"] = digest(model)

    accelerator, model, opt, _ = _accelerated("onebit_adam")
    accelerator.load_state(f"{output_dir}/half")
    compcoll.checkpoint.load(f"{output_dir}/half", opt.optimizer)
    _micro_steps(accelerator, model, opt, comm, range(12, 24))
    results["1-bit Adam, resumed at 12"] = digest(model)

    accelerator, model, opt, state = _accelerated("sgd")
    _micro_steps(accelerator, model, opt, comm, range(24))
    assert state.schedule.iteration == 12 and state.allreduce.state_dict(), state.schedule
    results["SGD, onebit_hook"] = digest(model)
    (Path(output_dir) / f"rank{comm.rank}.json").write_text(json.dumps(results))


def trainer_resumes_on_another_world_size(comm: compcoll.Communicator, output_dir: str) -> None:
    """An elastic restart: ``trainer_runs``' default checkpoint of 2 ranks resumed on ``comm.size`` ranks. Each rank
    warns once that its error buffers restart (it loads rank ``rank % 2``'s file), the run ends at step 60 in 1-bit
    Adam's compressed phase with identical replicas, and records its eval loss."""
    resumed = _trainer(huggingface.Trainer, f"{output_dir}/elastic")
    said = warned(resumed.train, resume_from_checkpoint=f"{output_dir}/default/checkpoint-{STEPS // 2}")
    said = [s for s in said if "loaded the state" in s]
    assert len(said) == 1 and f"of 2 on rank {comm.rank} of {comm.size}" in said[0], said
    opt = resumed.optimizer.optimizer
    assert opt.steps == STEPS and opt.compressing, opt.steps
    _record(output_dir, comm.rank, f"default, resumed at 30 on {comm.size} ranks", resumed)


def trainer_compiles(comm: compcoll.Communicator, output_dir: str) -> None:
    """``torch_compile=True`` (Dynamo's "eager" backend): the Trainer compiles the DDP-wrapped model, compcoll's
    Trainer still registers ``local_hook`` on that DDP, and 1-bit Adam takes its 12 steps; each rank records its
    digest."""
    compiled = _trainer(huggingface.Trainer, f"{output_dir}/compiled", torch_compile=True,
                        torch_compile_backend="eager", max_steps=12, save_strategy="no")
    compiled.train()
    opt = compiled.optimizer.optimizer
    assert isinstance(opt, OneBitAdam) and opt.steps == 12, (type(opt), opt.steps)
    assert compiled._hooked is not None, "local_hook not registered under torch_compile"
    _record(output_dir, comm.rank, "compiled", compiled)


def accelerate_compiles(comm: compcoll.Communicator) -> None:
    """Accelerate's ``dynamo_backend``: ``prepare`` returns the DDP compiled (an OptimizedModule), and
    ``register_hook`` still gives that DDP ``local_hook`` (it took the compiled model for one without DDP, so DDP
    averaged every gradient before 1-bit Adam averaged it again); 1-bit Adam takes its steps."""
    accelerate.state.AcceleratorState._reset_state(True)
    accelerator = accelerate.Accelerator(cpu=True, dynamo_backend="eager")
    model, opt = accelerator.prepare(gpt2(), OneBitAdam(gpt2().parameters(), lr=1e-3, freeze_step=2))
    assert not isinstance(model, torch.nn.parallel.DistributedDataParallel), type(model)
    huggingface.register_hook(model, opt, accelerator)
    assert model._orig_mod._get_ddp_logging_data().get("comm_hook") == "local_hook"
    _micro_steps(accelerator, model, opt, comm, range(4))
    assert opt.optimizer.steps == 4, opt.optimizer.steps


def trainer_refuses_deepspeed(comm: compcoll.Communicator, output_dir: str) -> None:
    """compcoll's Trainer under DeepSpeed (``--deepspeed``: its engine averages the gradients and owns the optimizer,
    so a config with an optimizer trained without compcoll, with nothing said): a ValueError naming it, on every rank,
    at construction."""
    config = {"train_micro_batch_size_per_gpu": "auto", "train_batch_size": "auto",
              "gradient_accumulation_steps": "auto", "zero_optimization": {"stage": 0}}
    environment = dict(os.environ)  # the arguments set ACCELERATE_USE_*: the pooled rank's next cases must not see it
    try:
        args = transformers.TrainingArguments(output_dir=f"{output_dir}/deepspeed", max_steps=2, use_cpu=True,
                                              report_to=[], deepspeed=config)
        huggingface.Trainer(model=gpt2(), args=args, train_dataset=Bytes(32, 1))
    except ValueError as exc:
        assert "compcoll's Trainer does not run under DeepSpeed" in str(exc), exc
    else:
        raise AssertionError("compcoll's Trainer built under DeepSpeed")
    finally:
        os.environ.clear()
        os.environ.update(environment)
        accelerate.state.AcceleratorState._reset_state(reset_partial_state=True)


def register_hook_takes_ddps_group(comm: compcoll.Communicator) -> None:
    """``register_hook`` on a DDP over the subgroups [0, 2] and [1, 3] of 4 ranks, each with another model of the
    same shapes (beside tensor or pipeline parallelism), builds its ``OneBitState`` on DDP's group: SGD trains in 1
    bit, replicas equal (before 2026-12-03 the state was on the default group, and averaged both models' gradients
    together; since that day's check, a ``RankMismatchError``)."""
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    from compcoll.launcher import seeded

    rank = dist.get_rank()
    groups = [dist.new_group([0, 2]), dist.new_group([1, 3])]
    with seeded(rank % 2):
        net = torch.nn.Sequential(torch.nn.Linear(30, 71), torch.nn.Tanh(), torch.nn.Linear(71, 7))
    model = DistributedDataParallel(net, process_group=groups[rank % 2])
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    state = huggingface.register_hook(model, opt, start_iter=1, min_compress_numel=1)
    assert state.comm.size == 2, state.comm.size
    gen = torch.Generator().manual_seed(rank)
    for _ in range(3):
        model(torch.randn(8, 30, generator=gen)).square().mean().backward()
        opt.step()
        opt.zero_grad()
    assert state.allreduce.plans, "no bucket went compressed"
    digests = [None] * 4
    dist.all_gather_object(digests, digest(model))
    assert digests[rank] == digests[rank ^ 2], f"rank {rank}: DDP's replicas differ"
