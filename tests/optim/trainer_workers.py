"""Rank-side bodies of the Trainer trial: compcoll's 1-bit Adam under the Hugging Face Trainer on Gloo ranks."""

from __future__ import annotations

import codecs
import json
import this
import warnings

import torch
import transformers

import compcoll
import compcoll.ddp
from compcoll.optim import OneBitAdam

STEPS = 60
CONTEXT = 32


class Bytes(torch.utils.data.Dataset):
    """Windows of CONTEXT + 1 bytes of the Zen of Python at seeded offsets (inputs and labels: the same bytes)."""

    def __init__(self, count: int, seed: int) -> None:
        text = torch.tensor(list(codecs.decode(this.s, "rot13").encode()))
        starts = torch.randint(0, len(text) - CONTEXT, (count,), generator=torch.Generator().manual_seed(seed))
        self.windows = [text[s:s + CONTEXT] for s in starts.tolist()]

    def __len__(self) -> int:
        return len(self.windows)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.windows[i], "labels": self.windows[i]}


class LocalGradients(transformers.TrainerCallback):
    """Register compcoll's local_hook on the Trainer's DDP once it exists, so gradients are averaged only by the
    optimizer (the Trainer hands callbacks the unwrapped model, so this keeps the trainer)."""

    def __init__(self) -> None:
        self.trainer: transformers.Trainer | None = None

    def on_train_begin(self, args, state, control, **kwargs):
        wrapped = self.trainer.model_wrapped
        if isinstance(wrapped, torch.nn.parallel.DistributedDataParallel):
            wrapped.register_comm_hook(None, compcoll.ddp.local_hook)


def _trainer(output_dir: str, optimizer: str, **overrides) -> transformers.Trainer:
    """A 2-layer byte-level GPT-2 (the same initial weights on every rank) and a Trainer for STEPS steps."""
    torch.manual_seed(0)
    config = transformers.GPT2Config(vocab_size=256, n_positions=CONTEXT, n_embd=64, n_layer=2, n_head=4)
    model = transformers.GPT2LMHeadModel(config)
    args = transformers.TrainingArguments(
        output_dir=output_dir, max_steps=STEPS, per_device_train_batch_size=8, learning_rate=1e-3, seed=0,
        save_strategy="steps", save_steps=STEPS // 2, logging_steps=10, report_to=[], use_cpu=True,
        dataloader_num_workers=0, **overrides)
    callback = LocalGradients()
    optimizers = (None, None)
    if optimizer == "onebit_adam":
        optimizers = (OneBitAdam(model.parameters(), lr=1e-3, freeze_step=0.15, total_steps=STEPS), None)
    trainer = transformers.Trainer(model=model, args=args, train_dataset=Bytes(STEPS * 16, 1),
                                   eval_dataset=Bytes(64, 2), optimizers=optimizers,
                                   callbacks=[callback] if optimizer == "onebit_adam" else [])
    callback.trainer = trainer
    return trainer


def trains_and_resumes(comm: compcoll.Communicator, output_dir: str) -> None:
    """AdamW (the Trainer's default), then 1-bit Adam with local_hook (warmup 15% of the run), then 1-bit Adam
    resumed from the Trainer's own step-30 checkpoint; rank 0 writes the eval losses to output_dir/losses.json."""
    losses = {}
    for name, optimizer in (("AdamW", "adamw"), ("1-bit Adam", "onebit_adam")):
        trainer = _trainer(f"{output_dir}/{optimizer}", optimizer)
        trainer.train()
        losses[name] = trainer.evaluate()["eval_loss"]
        if optimizer == "onebit_adam":
            opt = trainer.optimizer.optimizer if hasattr(trainer.optimizer, "optimizer") else trainer.optimizer
            assert opt.steps + opt.skipped_steps == STEPS and opt.compressing, (opt.steps, opt.skipped_steps)
            assert opt.channel.worker_error.abs().sum() > 0, "1-bit Adam never compressed"
    resumed = _trainer(f"{output_dir}/onebit_adam", "onebit_adam")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        resumed.train(resume_from_checkpoint=f"{output_dir}/onebit_adam/checkpoint-{STEPS // 2}")
    losses["1-bit Adam resumed at 30"] = resumed.evaluate()["eval_loss"]
    warned = any("restart at zero" in str(w.message) for w in caught)
    assert warned == (comm.rank != 0), f"rank {comm.rank}: loading rank 0's optimizer state warned: {warned}"
    if comm.rank == 0:
        with open(f"{output_dir}/losses.json", "w") as f:
            json.dump(losses, f)
