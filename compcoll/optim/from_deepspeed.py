"""DeepSpeed 0.19.6's 1-bit optimizer configs and checkpoints, carried over to compcoll's optimizers."""

from __future__ import annotations

import importlib
import inspect
import json
import logging
import os
import pickle
import re
from pathlib import Path
from typing import Any, Iterable

import torch

from ..comm.base import Communicator
from .base import CompressedOptimizer
from .onebit_adam import OneBitAdam
from .onebit_lamb import OneBitLamb
from .carry import carry
from .schedules import NOT_CARRIED, SCHEDULES
from .zero_one_adam import ZeroOneAdam

log = logging.getLogger(__name__)

_COMMON = ("lr", "betas", "eps", "weight_decay")
OPTIMIZERS: dict[str, tuple[type[CompressedOptimizer], tuple[str, ...]]] = {
    "onebitadam": (OneBitAdam, _COMMON + ("freeze_step",)),
    "onebitlamb": (OneBitLamb, _COMMON + ("freeze_step", "max_coeff", "min_coeff", "coeff_beta", "factor_max",
                                          "factor_min", "factor_threshold")),
    "zerooneadam": (ZeroOneAdam, _COMMON + ("var_freeze_step", "var_update_scaler", "local_step_scaler",
                                            "local_step_clipper")),
}
"""DeepSpeed's type name, lowered as DeepSpeed lowers it: compcoll's class and the ``params`` keys it takes as they
are (the same names, meanings and defaults as in DeepSpeed 0.19.6)."""

NOT_NEEDED: dict[str, str] = {
    "cuda_aware": "compcoll sends CUDA tensors through CUDA-aware MPI where the loaded libmpi is one (detected, or "
                  "compcoll.MPIComm(cuda_aware=True) / COMPCOLL_CUDA_AWARE=1), not by an optimizer's flag",
    "comm_backend_name": "the communicator given as comm (by default torch.distributed's group) is the transport",
    "bias_correction": "DeepSpeed 0.19.6's 1-bit optimizers never apply it, so neither do the optimizers built "
                       "here (OneBitAdam(bias_correction=True) is torch.optim.Adam's correction, outside a config)",
    "eps_inside_sqrt": "DeepSpeed 0.19.6 adds eps outside the square root whatever it says, as compcoll does",
    "amsgrad": "false is the only value DeepSpeed accepted",
}
"""``params`` keys that change nothing in DeepSpeed 0.19.6's numerics: accepted, with a note."""

REFUSED: dict[str, str] = {
    "max_grad_norm": "DeepSpeed 0.19.6 refuses it too; clip with torch.nn.utils.clip_grad_norm_ before step()",
}
"""``params`` keys whose value would change the numerics in a way compcoll's optimizers do not offer."""

ENGINE: dict[str, str] = {
    "gradient_clipping": "the DeepSpeed engine clipped the gradients; call torch.nn.utils.clip_grad_norm_ "
                         "before step()",
    "fp16": "use compcoll.optim.GradScaler for a dynamic loss scale",
    "amp": "use compcoll.optim.GradScaler for a dynamic loss scale",
    "bf16": "give the model bfloat16 parameters: compcoll's optimizers keep float32 master weights",
    "scheduler": "build it with compcoll.optim.scheduler_from_deepspeed_config(config, optimizer) and call its "
                 "step() after each optimizer step, as the engine did",
}
"""Top-level keys the DeepSpeed engine acted on, which now fall to the training loop: noted."""

NUMERICS: dict[str, dict[str, dict[str, Any]]] = {
    "compcoll": {},
    "deepspeed": {"onebitadam": dict(compress="momentum", scale="l2", protocol="gather_scatter"),
                  "onebitlamb": dict(compress="momentum", scale="l2", trust_ratio="frozen", protocol="gather_scatter"),
                  "zerooneadam": dict(compress="momentum", scale="l2", protocol="gather_scatter")},
}
"""Compression settings over the optimizer's defaults: none for compcoll's (chosen on its benchmarks,
docs/guides/optimizers.md), or DeepSpeed's."""


AUTO = "auto"
"""A config value that transformers' Trainer fills in from its TrainingArguments (its DeepSpeed integration)."""


def _read_config(config: dict[str, Any] | str | os.PathLike) -> dict[str, Any]:
    """A DeepSpeed config as a dict: ``config`` itself, or the JSON file at that path."""
    if isinstance(config, dict):
        return config
    with open(config) as f:
        return json.load(f)


def from_deepspeed_config(config: dict[str, Any] | str | os.PathLike, params: Iterable,
                          comm: Communicator | None = None, *, numerics: str = "compcoll",
                          **options: Any) -> CompressedOptimizer:
    """The compcoll optimizer that a DeepSpeed 0.19.6 config's ``"optimizer"`` section describes.

    1. Read the config (a dict, or the path of its JSON file) and match its optimizer
       ``type`` case-insensitively, as DeepSpeed does: OneBitAdam, OneBitLamb or
       ZeroOneAdam; any other type raises ValueError naming it.
    2. Carry each ``params`` key over under the same name. A key that changes nothing in
       DeepSpeed's numerics (``NOT_NEEDED``) is dropped with a note; one that would change
       them and has no compcoll counterpart (``REFUSED``, ``amsgrad: true``, or a key
       compcoll does not know) raises ValueError naming it, before anything is built. A
       value ``"auto"`` (which transformers' Trainer fills in from its TrainingArguments)
       takes the keyword argument of that name, and raises ValueError without one.
    3. Note each top-level key the DeepSpeed engine acted on (``ENGINE``: clipping, loss
       scaling, schedulers); refuse ``zero_optimization`` with a stage above 0, which
       DeepSpeed refused for these optimizers too.
    4. Build the optimizer with ``numerics``' compression settings (``NUMERICS``), then
       ``options`` (any other keyword of the optimizer, e.g. ``nonfinite`` or ``protocol``).

    Args:
        config: the DeepSpeed config, or the path of its JSON file.
        params: the model's parameters or parameter groups, as for any torch optimizer.
        comm: compcoll's communicator (default: the optimizer's, torch.distributed's group).
        numerics: "compcoll" (default: compcoll's compression settings, which converged
            where DeepSpeed's diverged, docs/guides/optimizers.md) or "deepspeed" (the momentum
            compressed with the l2 scale through gather-scatter at every world size, and 1-bit
            LAMB's frozen trust ratios: DeepSpeed's).
        **options: further keyword arguments of the optimizer; one that a config key
            already sets raises ValueError.

    Returns:
        The optimizer, with a log line (logger ``compcoll.optim.from_deepspeed``, INFO)
        saying what was built.
    """
    config = _read_config(config)
    section = config.get("optimizer")
    if not isinstance(section, dict) or "type" not in section:
        raise ValueError('DeepSpeed config: no "optimizer" section with a "type"')
    kind = str(section["type"]).lower()
    if kind not in OPTIMIZERS:
        raise ValueError(f"DeepSpeed config: optimizer type {section['type']!r} is not one of DeepSpeed's 1-bit "
                         f"optimizers that compcoll carries on (OneBitAdam, OneBitLamb, ZeroOneAdam)")
    if numerics not in NUMERICS:
        raise ValueError(f"numerics must be one of {', '.join(NUMERICS)}, got {numerics!r}")
    cls, known = OPTIMIZERS[kind]
    keys = section.get("params") or {}
    if not isinstance(keys, dict):
        raise ValueError(f'DeepSpeed config: the optimizer\'s "params" must be an object of keys, got {keys!r}')
    kwargs = _carried(cls.__name__, keys, known)
    _note_engine_keys(cls.__name__, config)
    for key in [key for key, value in kwargs.items() if value == AUTO]:
        if key not in options:
            raise ValueError(f'DeepSpeed config: {key} is "auto", which transformers\' Trainer fills in from its '
                             f"TrainingArguments; give the value: from_deepspeed_config(config, params, {key}=...)")
        del kwargs[key]
    clash = sorted(set(kwargs) & set(options))
    if clash:
        raise ValueError(f"DeepSpeed config: {', '.join(clash)} set both in the config and as keyword arguments")
    kwargs.update(NUMERICS[numerics].get(kind, {}))
    kwargs.update(options)
    optimizer = cls(params, comm=comm, **kwargs)
    log.info("DeepSpeed config: built %s(%s) with %s's numerics", cls.__name__,
             ", ".join(f"{k}={v!r}" for k, v in kwargs.items()), numerics)
    return optimizer


def _carried(name: str, params: dict[str, Any], known: tuple[str, ...]) -> dict[str, Any]:
    """The ``params`` keys compcoll takes, checked; notes for the ones it drops."""
    if params.get("amsgrad"):
        raise ValueError(f"DeepSpeed config: {name} has no AMSGrad variant (amsgrad: true), in DeepSpeed or compcoll")
    for key in params:
        if key in REFUSED:
            raise ValueError(f"DeepSpeed config: optimizer param {key!r} is not supported: {REFUSED[key]}")
        if key not in known and key not in NOT_NEEDED:
            raise ValueError(f"DeepSpeed config: optimizer param {key!r} is not one of {name}'s in DeepSpeed 0.19.6 "
                             f"({', '.join(known + tuple(NOT_NEEDED))})")
    for key in params.keys() & NOT_NEEDED.keys():
        log.info("DeepSpeed config: %s=%r not needed: %s", key, params[key], NOT_NEEDED[key])
    carried = {key: value for key, value in params.items() if key in known}
    if "betas" in carried and carried["betas"] != AUTO:
        carried["betas"] = tuple(carried["betas"])
    return carried


def _note_engine_keys(name: str, config: dict[str, Any]) -> None:
    """A note for each engine key the training loop now owns; ZeRO (stage > 0) refused."""
    zero = config.get("zero_optimization") or {}
    if isinstance(zero, dict) and int(zero.get("stage", 0)) > 0:
        raise ValueError(f"DeepSpeed config: zero_optimization stage {zero['stage']} with {name}: its compression "
                         f"needs each rank's whole momentum (DeepSpeed refused this too); use stage 0")
    for key in config.keys() & ENGINE.keys():
        section = config[key]
        if isinstance(section, dict) and section.get("enabled") is False:
            continue
        log.warning("DeepSpeed config: %r was the engine's: %s", key, ENGINE[key])


def scheduler_from_deepspeed_config(config: dict[str, Any] | str | os.PathLike, optimizer: torch.optim.Optimizer
                                    ) -> torch.optim.lr_scheduler.LRScheduler:
    """The learning-rate schedule a DeepSpeed 0.19.6 config's ``"scheduler"`` section describes, on ``optimizer``.

    1. Read the config (a dict, or the path of its JSON file) and its ``type``, spelled as
       DeepSpeed spells it: WarmupLR, WarmupDecayLR, WarmupCosineLR or OneCycle (``optim.schedules``:
       DeepSpeed's learning rates, bit for bit, with ``step()`` after every optimizer step, as the
       engine steps them), or the name of a scheduler of ``torch.optim.lr_scheduler`` (the
       engine's fallback, built as it built it: ``params`` as keyword arguments).
    2. DeepSpeed's LRRangeTest is refused with the reason (``schedules.NOT_CARRIED``);
       a ``params`` key the schedule does not take, or ``last_batch_iteration`` (resume
       through the scheduler's ``state_dict``), raises ValueError naming it.

    Args:
        config: the DeepSpeed config, or the path of its JSON file.
        optimizer: the optimizer the schedule drives (``from_deepspeed_config``'s, or any torch optimizer).

    Returns:
        The scheduler: call its ``step()`` after each ``optimizer.step()``.
    """
    config = _read_config(config)
    section = config.get("scheduler")
    if not isinstance(section, dict) or "type" not in section:
        raise ValueError('DeepSpeed config: no "scheduler" section with a "type"')
    kind, params = str(section["type"]), dict(section.get("params") or {})
    if kind in NOT_CARRIED:
        raise ValueError(f"DeepSpeed config: scheduler {kind} is not carried over: {NOT_CARRIED[kind]}")
    if "last_batch_iteration" in params:
        raise ValueError("DeepSpeed config: scheduler param 'last_batch_iteration' is not taken; resume a schedule "
                         "through its state_dict() / load_state_dict()")
    cls = SCHEDULES.get(kind) or getattr(torch.optim.lr_scheduler, kind, None)
    if not (isinstance(cls, type) and issubclass(cls, torch.optim.lr_scheduler.LRScheduler)):
        raise ValueError(f"DeepSpeed config: scheduler type {kind!r} is neither one of DeepSpeed's carried over "
                         f"({', '.join(SCHEDULES)}) nor a scheduler of torch.optim.lr_scheduler")
    known = set(inspect.signature(cls.__init__).parameters) - {"self", "optimizer", "last_epoch", "verbose"}
    unknown = sorted(set(params) - known)
    if unknown:
        raise ValueError(f"DeepSpeed config: scheduler param(s) {', '.join(map(repr, unknown))} not taken by {kind} "
                         f"({', '.join(sorted(known))})")
    scheduler = cls(optimizer, **params)
    log.info("DeepSpeed config: built the %s schedule with %s", kind,
             ", ".join(f"{k}={v!r}" for k, v in params.items()) or "its defaults")
    return scheduler


CHECKPOINT_FILE = "mp_rank_00_model_states.pt"
"""The file of a DeepSpeed checkpoint (ZeRO off) that holds the module and the optimizer's state."""


def load_deepspeed_checkpoint(optimizer: CompressedOptimizer, checkpoint: dict[str, Any] | str | os.PathLike,
                              *, allow: Iterable[str] = ()) -> dict[str, Any]:
    """Carry a DeepSpeed 0.19.6 OneBitAdam, OneBitLamb or ZeroOneAdam checkpoint's optimizer state into compcoll's
    ``optimizer``.

    1. Find the file: ``checkpoint`` itself, ``<dir>/<tag>/mp_rank_00_model_states.pt``
       with the tag read from ``<dir>/latest`` (``engine.save_checkpoint``'s layout), or
       ``<dir>/mp_rank_00_model_states.pt``; a dict is taken as already loaded.
    2. Read it with ``torch.load(weights_only=True)``: unpickling arbitrary objects can run
       code, so a file that needs more is refused with torch's reason, unless the caller
       names the globals to allow (``allow=("argparse.Namespace",)``).
    3. Take its optimizer state (``"optimizer"``; inside an fp16 wrapper,
       ``"optimizer_state_dict"``): per parameter, in parameter-group order, the moments
       (``MOMENTS``: ``exp_avg``, ``exp_avg_sq``; 1-bit LAMB's ``exp_avg_sq_fresh`` too) and
       ``step``; 1-bit LAMB's ``lamb_coeff_freeze``, ``last_factor`` and, once its compression
       started, ``scaling_coeff`` (none needed for a parameter the optimizer keeps frozen,
       which DeepSpeed's skips too); 0/1 Adam's ``var_interval``, ``var_counter``,
       ``local_step_interval`` and ``local_step_counter``. Check that the groups, parameter
       count and every trained shape match the optimizer's (ValueError naming the first that
       differs; nothing changes).
    4. Copy them into the optimizer's flat buffers (1-bit LAMB's floats into its per-layer
       buffers) and set its step count, so its phase follows from ``freeze_step``
       (``var_freeze_step``) as in DeepSpeed, and 0/1 Adam's schedule. The error buffers
       restart at zero, as DeepSpeed's own load does (it saves one rank's only), and so do
       0/1 Adam's local steps since its last synchronisation (its accumulated momentum),
       which DeepSpeed's own load drops too. Unlike DeepSpeed's load, whose first step in a
       new process restarts 0/1 Adam's intervals at 1, the schedule goes on where it was.

    Args:
        optimizer: a compcoll ``OneBitAdam``, ``OneBitLamb`` or ``ZeroOneAdam`` over the same parameters, in the
            same groups.
        checkpoint: the checkpoint's file or folder, or its loaded dict.
        allow: "module.Name" of each further global the file may unpickle.

    Returns:
        The checkpoint's dict: load the model's weights from its ``"module"``.
    """
    if not optimizer._carried:
        raise ValueError(f"load_deepspeed_checkpoint carries OneBitAdam's, OneBitLamb's and ZeroOneAdam's state; "
                         f"got {type(optimizer).__name__}")
    loaded = checkpoint if isinstance(checkpoint, dict) else _read_checkpoint(Path(checkpoint), tuple(allow))
    carry(optimizer, *_optimizer_state(loaded), "DeepSpeed checkpoint")
    return loaded


def _read_checkpoint(path: Path, allow: tuple[str, ...]) -> dict[str, Any]:
    """The checkpoint file's dict, read with ``weights_only=True`` and the globals named in ``allow``."""
    if path.is_dir():
        latest = path / "latest"
        path = path / latest.read_text().strip() / CHECKPOINT_FILE if latest.exists() else path / CHECKPOINT_FILE
    allowed = [_named_global(name) for name in allow]
    try:
        with torch.serialization.safe_globals(allowed):
            return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:
        named = re.search(r"GLOBAL (\S+)", str(exc))
        reason = f"it unpickles {named.group(1)}" if named else str(exc).strip().splitlines()[-1]
        raise ValueError(f"DeepSpeed checkpoint {path}: refused, since it needs more than tensors and plain "
                         f"containers to load ({reason}); if you trust the file, name what it needs in allow="
                         ) from exc


def _named_global(name: str) -> Any:
    """The object ``"module.Name"`` names."""
    module, _, attribute = name.rpartition(".")
    if not module:
        raise ValueError(f"allow: {name!r} is not a 'module.Name'")
    return getattr(importlib.import_module(module), attribute)


def _optimizer_state(loaded: dict[str, Any]) -> tuple[dict[int, dict[str, Any]], list[dict[str, Any]]]:
    """(per-parameter state, parameter groups) of a checkpoint dict, a model-states file's or an optimizer's own."""
    found = loaded.get("optimizer", loaded)
    if isinstance(found, dict) and "optimizer_state_dict" in found:
        found = found["optimizer_state_dict"]
    if not isinstance(found, dict) or "state" not in found or "param_groups" not in found:
        raise ValueError("DeepSpeed checkpoint: no optimizer state in it (saved with ZeRO, or without an optimizer?)")
    return found["state"], found["param_groups"]
