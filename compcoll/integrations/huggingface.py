"""compcoll under Hugging Face (``pip install 'compcoll[hf]'``): a 1-bit Trainer, and a hook helper for Accelerate."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import torch
from torch.nn.parallel import DistributedDataParallel

from .. import checkpoint
from ..algorithms.agreement import agree_settings
from ..ddp import OneBitState, local_hook, onebit_hook
from ..optim import CompressedOptimizer, GradScaler, OneBitAdam

try:
    import transformers
except ModuleNotFoundError as missing:
    raise ModuleNotFoundError(f"compcoll.integrations.huggingface needs transformers ({missing}): pip install "
                              f"'compcoll[hf]' (transformers and accelerate)", name="transformers") from missing

log = transformers.utils.logging.get_logger(__name__)

FREEZE_SHARE = 0.15
"""1-bit Adam's warm-up under the Trainer: this share of the run's optimizer steps (the 1-bit Adam paper: 15-25%)."""

_ADAM = (torch.optim.Adam, torch.optim.AdamW)


def _inner(optimizer: Any) -> Any:
    """The optimizer itself, out of Accelerate's ``AcceleratedOptimizer`` wrapper when it is in one."""
    return getattr(optimizer, "optimizer", optimizer)


def _onebit_adam_options(kwargs: dict[str, Any], total_steps: int, options: dict[str, Any]) -> dict[str, Any]:
    """OneBitAdam's options for what the Trainer would have built as torch's Adam / AdamW with ``kwargs``."""
    chosen = {"lr": kwargs["lr"], "freeze_step": FREEZE_SHARE, "total_steps": total_steps}
    chosen.update({key: kwargs[key] for key in ("betas", "eps") if key in kwargs})
    chosen.update(options)
    return chosen


def agree_on_overflows(accelerator: Any, optimizer: Any) -> None:
    """Give Accelerate's fp16 loss scaling compcoll's ``GradScaler``, so every rank skips and backs off alike.

    Under ``local_hook`` each rank unscales its own gradient, so torch's ``GradScaler``
    (Accelerate makes one for fp16 on GPUs) can find an overflow on one rank only: the
    compcoll optimizer still skips that step on every rank, but the loss scales drift apart.
    1. Nothing to do without a scaler, with compcoll's already, or when the optimizer is not
       compcoll's (its gradients were averaged, so every rank sees the same overflows).
    2. Otherwise build ``compcoll.optim.GradScaler`` with the scaler's settings and state,
       and put it where Accelerate looks: ``accelerator.scaler`` and the prepared optimizer's.
    """
    scaler = getattr(accelerator, "scaler", None)
    if scaler is None or isinstance(scaler, GradScaler) or not isinstance(_inner(optimizer), CompressedOptimizer):
        return
    agreed = GradScaler(scaler._device, init_scale=scaler.get_scale(), growth_factor=scaler.get_growth_factor(),
                        backoff_factor=scaler.get_backoff_factor(), growth_interval=scaler.get_growth_interval(),
                        enabled=scaler.is_enabled())
    agreed.load_state_dict(scaler.state_dict())
    accelerator.scaler = agreed
    if hasattr(optimizer, "scaler"):
        optimizer.scaler = agreed


class OneBitMixin:
    """What makes a Hugging Face Trainer communicate in 1 bit; put it before the Trainer class it extends.

    ``compcoll.integrations.huggingface.Trainer`` is ``transformers.Trainer`` with it; for
    another Trainer (TRL's ``SFTTrainer``, a subclass of your own):
    ``class Trainer(OneBitMixin, SFTTrainer): pass``. Then, per run:
    1. The optimizer. The one the Trainer would build from ``args.optim``: torch's Adam or
       AdamW becomes ``OneBitAdam`` with the same learning rate, betas, eps and parameter
       groups (the Trainer's weight decay per group, decoupled as AdamW's), warming up for
       ``FREEZE_SHARE`` of the run's optimizer steps; SGD stays SGD. An optimizer passed in
       ``optimizers=`` is kept as it is.
    2. The DDP hook, registered on the model the Trainer wrapped: a compcoll optimizer
       averages its gradients itself, so DDP gets ``local_hook`` (nothing averaged twice);
       SGD's gradients go through ``onebit_hook`` (error-compensated 1-bit); any other
       optimizer keeps DDP's float32 allreduce, since raw 1-bit gradients break Adam-like
       variance estimates (the 1-bit Adam paper). One log line on rank 0 says which.
    3. Checkpoints. The Trainer's own save writes rank 0's optimizer; besides it, every
       rank writes its own compcoll state (the optimizer's error buffers and local moments,
       the hook's error buffers: ``compcoll.checkpoint``) into the checkpoint folder, and
       ``train(resume_from_checkpoint=...)`` loads it back, so a resumed run continues bit
       for bit. Resume with the world size that saved. A checkpoint of a plain Trainer run
       (AdamW) switches that run to 1-bit: the optimizer carries in AdamW's moments and step
       (``OneBitAdam.load_state_dict``) and the per-rank state starts afresh.
    4. fp16 loss scaling under a compcoll optimizer agrees on overflows across ranks
       (``agree_on_overflows``).

    Args (keyword, to the Trainer's constructor):
        compression: options for what step 1-2 chose: ``OneBitAdam``'s (``freeze_step``,
            ``compress``, ``scale``, ...), or ``OneBitState``'s for SGD's hook.
    """

    def __init__(self, *args: Any, compression: dict[str, Any] | None = None, **kwargs: Any) -> None:
        self.compression = dict(compression or {})
        self.hook_state: OneBitState | None = None
        self._hook: Any = None
        self._hooked: DistributedDataParallel | None = None
        super().__init__(*args, **kwargs)
        if getattr(self, "is_deepspeed_enabled", False):
            raise ValueError("compcoll's Trainer does not run under DeepSpeed (--deepspeed): its engine averages the "
                             "gradients and builds or wraps the optimizer; keep transformers' Trainer for DeepSpeed's "
                             "own 1-bit optimizers, or carry the config over with "
                             "compcoll.optim.from_deepspeed_config (docs/guides/deepspeed.md)")

    def create_optimizer(self, model: torch.nn.Module | None = None) -> torch.optim.Optimizer:
        """The Trainer's optimizer, with torch's Adam / AdamW built as ``OneBitAdam`` (class docstring, step 1)."""
        given = self.optimizer_cls_and_kwargs
        if self.optimizer is None:
            cls, kwargs = given or self.get_optimizer_cls_and_kwargs(self.args, self.model if model is None else model)
            if cls in _ADAM:
                self.optimizer_cls_and_kwargs = (OneBitAdam, _onebit_adam_options(kwargs, self.state.max_steps,
                                                                                  self.compression))
        try:
            optimizer = super().create_optimizer(model)
        finally:
            self.optimizer_cls_and_kwargs = given
        if self._hook is None:
            self._choose_hook(_inner(optimizer))
        return optimizer

    def _choose_hook(self, optimizer: torch.optim.Optimizer) -> None:
        """Step 2 of the class docstring: the hook (and its state) for ``optimizer``, said in one log line."""
        name = type(optimizer).__name__
        if isinstance(optimizer, CompressedOptimizer):
            self._hook = local_hook
            warmup = getattr(optimizer, "freeze_step", None)
            chosen = (f"{name} averages in 1 bit itself" + (f" after {warmup} warm-up steps" if warmup else "")
                      + "; DDP gets local_hook")
        elif isinstance(optimizer, torch.optim.SGD):
            self.hook_state = OneBitState(**self.compression)
            self._hook = onebit_hook
            chosen = f"{name}'s gradients go through onebit_hook"
        else:
            self._hook = False
            chosen = (f"no 1-bit form for {name}: DDP averages its gradients in float32 (1-bit gradients break "
                      f"Adam-like variance; use OneBitAdam, OneBitLamb or ZeroOneAdam, or SGD)")
        if self.is_world_process_zero():
            log.warning(f"compcoll: {chosen}")

    def _states(self) -> list[Any]:
        """The objects whose per-rank state a checkpoint holds (class docstring, step 3)."""
        optimizer = _inner(self.optimizer)
        return ([optimizer] if isinstance(optimizer, CompressedOptimizer) else []) + (
            [self.hook_state] if self.hook_state is not None else [])

    def _prepare_for_training(self, max_steps: int, train_dataloader: Any, resume_from_checkpoint: str | None
                              ) -> Any:
        """The Trainer's preparation, then the chosen hook on the DDP it wrapped (once per DDP) and the agreed loss
        scaler."""
        model, train_dataloader = super()._prepare_for_training(max_steps, train_dataloader, resume_from_checkpoint)
        agree_on_overflows(self.accelerator, self.optimizer)
        ddp = _ddp(model)
        if ddp is not None and self._hook and ddp is not self._hooked:
            ddp.register_comm_hook(self.hook_state, self._hook)
            self._hooked = ddp
        return model, train_dataloader

    def _save_optimizer_and_scheduler(self, output_dir: str) -> None:
        """The Trainer's save (rank 0's optimizer, the scheduler), then every rank's own compcoll state."""
        super()._save_optimizer_and_scheduler(output_dir)
        states = self._states()
        if states:
            checkpoint.save(output_dir, *states)

    def _load_optimizer_and_scheduler(self, checkpoint_dir: str | None) -> None:
        """The Trainer's load (rank 0's optimizer state on every rank), then each rank's own compcoll state over it.

        1. The Trainer loads rank 0's optimizer state and the scheduler on every rank; a
           compcoll optimizer warns there that other ranks' error buffers restart at zero,
           which step 2 makes untrue, so that warning is not shown.
        2. ``compcoll.checkpoint.load`` puts back this rank's own state; a checkpoint that
           holds no rank's (saved by a plain Trainer: every rank must find none, else
           ``RankMismatchError``) leaves it afresh, with a log line: a torch AdamW's state
           loaded in step 1 carried its moments and step into a ``OneBitAdam``. A checkpoint
           of another world size fails on every rank.
        """
        states = self._states() if checkpoint_dir is not None else []
        with warnings.catch_warnings():
            if states:
                warnings.filterwarnings("ignore", message=".*restart at zero.*")
            super()._load_optimizer_and_scheduler(checkpoint_dir)
        if not states:
            return
        plain = not any(Path(checkpoint_dir).glob("compcoll-rank*-of-*.pt"))
        agree_settings(states[0].comm, "compcoll's Trainer resuming",
                       {"checkpoints without compcoll's per-rank files": int(plain)})
        if plain:
            log.warning(f"compcoll: {checkpoint_dir} holds no compcoll state (a plain Trainer's checkpoint): the "
                        f"optimizer took what its state carries, the error buffers and hook state start afresh")
            return
        checkpoint.load(checkpoint_dir, *states)


class Trainer(OneBitMixin, transformers.Trainer):
    """``transformers.Trainer`` that trains with 1-bit communication (``OneBitMixin``): change the import, nothing
    else."""


def _ddp(model: torch.nn.Module) -> DistributedDataParallel | None:
    """The DDP of a prepared model, also where ``torch.compile`` wrapped it (``torch_compile=True``, Accelerate's
    ``dynamo_backend``: an ``OptimizedModule`` whose ``_orig_mod`` is the DDP); None for a model without DDP."""
    model = getattr(model, "_orig_mod", model)
    return model if isinstance(model, DistributedDataParallel) else None


def register_hook(model: torch.nn.Module, optimizer: Any = None, accelerator: Any = None,
                  **options: Any) -> OneBitState | None:
    """Register compcoll's DDP hook on the model ``accelerator.prepare`` returned (Accelerate takes no custom hook).

    1. A model that is not DDP (one process) is left alone: None.
    2. A compcoll optimizer (``optimizer``, or the optimizer inside Accelerate's wrapper)
       averages its gradients itself: DDP gets ``local_hook``, and ``accelerator``'s fp16
       loss scaler, if any, agrees on overflows (``agree_on_overflows``); None.
    3. Otherwise DDP gets ``onebit_hook`` with ``OneBitState(**options)`` on DDP's own
       process group unless ``options`` name one, which is returned (save it per rank with
       ``compcoll.checkpoint.save``). With torch's Adam or AdamW it warns: raw 1-bit
       gradients break their variance; use ``compcoll.optim.OneBitAdam``.

    Args:
        model: what ``accelerator.prepare`` returned (a compiled one too).
        optimizer: the optimizer it returned, or None.
        accelerator: the Accelerator (for its loss scaler), or None.
        options: ``OneBitState``'s options.

    Returns:
        The hook's state, or None where step 1 or 2 applied.
    """
    model = _ddp(model)
    if model is None:
        return None
    inner = _inner(optimizer)
    if isinstance(inner, CompressedOptimizer):
        model.register_comm_hook(None, local_hook)
        agree_on_overflows(accelerator, optimizer)
        return None
    if isinstance(inner, _ADAM):
        warnings.warn(f"compcoll: 1-bit gradients under {type(inner).__name__} break its variance estimate (the "
                      f"1-bit Adam paper); compcoll.optim.OneBitAdam compresses its momentum instead", stacklevel=2)
    state = OneBitState(**{"process_group": model.process_group, **options})
    model.register_comm_hook(state, onebit_hook)
    return state
