"""A torch.amp.GradScaler whose overflow check is agreed across ranks, so that loss scales stay equal."""

from __future__ import annotations

import torch

from ..algorithms.agreement import agree
from ..errors import NonFiniteError


class GradScaler(torch.amp.GradScaler):
    """``torch.amp.GradScaler`` for compcoll's optimizers: every rank sees an overflow that any rank had.

    With local gradients, a plain ``GradScaler`` finds an overflow only on the rank that
    had it: the optimizers still skip the step on every rank (their own agreement round,
    see ``CompressedOptimizer``), but that rank's loss scale backs off while the others'
    do not. Here, after the usual check of this rank's gradients (``_unscale_grads_``):
    1. One small all-gather of (finite?) over the optimizer's communicator (``agree``).
    2. If any rank overflowed, every rank's found-inf becomes 1, so ``step`` skips and
       ``update`` backs off alike, and the loss scales stay equal on every rank.
    Optimizers without a ``comm`` (not compcoll's) are checked as torch does. Use it as
    ``torch.amp.GradScaler``: ``scaler.scale(loss).backward(); scaler.step(opt);
    scaler.update()``. As in ``ShardedGradScaler`` (FSDP), the agreement is a collective:
    every rank must call ``step`` (or ``unscale_``) for the same optimizers in the same order.
    """

    def _unscale_grads_(self, optimizer: torch.optim.Optimizer, inv_scale: torch.Tensor, found_inf: torch.Tensor,
                        allow_fp16: bool) -> dict[torch.device, torch.Tensor]:  # type: ignore[override]
        per_device = super()._unscale_grads_(optimizer, inv_scale, found_inf, allow_fp16)
        comm = getattr(optimizer, "comm", None)
        if comm is None:
            return per_device
        overflow = any(bool(flag.item()) for flag in per_device.values())
        try:
            agree(comm, "GradScaler.unscale_", found_inf, not overflow)
        except NonFiniteError:
            overflow = True
        for flag in per_device.values():
            flag.fill_(1.0 if overflow else 0.0)
        return per_device
