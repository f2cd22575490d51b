"""Adam-family moment updates shared by 1-bit Adam, 1-bit LAMB and 0/1 Adam, per parameter group."""

from __future__ import annotations

import torch

from .base import CompressedOptimizer


def averaged_moments(opt: CompressedOptimizer, grad: torch.Tensor, m: torch.Tensor, v: torch.Tensor) -> None:
    """Warmup: g_avg = exact average of ``grad`` over ranks; m = b1*m + (1-b1)*g_avg; v = b2*v + (1-b2)*g_avg^2.

    Raises NonFiniteError on every rank, before m or v change, when g_avg is not finite.
    """
    average = opt._average(grad, opt.workspace.get("optim.average", grad.numel(), torch.float32, grad.device))
    for group, sl in opt._groups():
        b1, b2 = group["betas"]
        m[sl].mul_(b1).add_(average[sl], alpha=1 - b1)
        v[sl].mul_(b2).addcmul_(average[sl], average[sl], value=1 - b2)


def local_momentum(opt: CompressedOptimizer, grad: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
    """b1*m + (1-b1)*grad with this rank's gradient, in a scratch buffer (m unchanged)."""
    local = opt.workspace.get("optim.local", grad.numel(), torch.float32, grad.device)
    for group, sl in opt._groups():
        b1 = group["betas"][0]
        torch.add(m[sl].mul(b1), grad[sl], alpha=1 - b1, out=local[sl])
    return local


def adam_step(opt: CompressedOptimizer, p: torch.Tensor, m: torch.Tensor, v: torch.Tensor) -> None:
    """p -= lr * (m / (sqrt(v) + eps) + weight_decay * p), with each group's hyperparameters."""
    for group, sl in opt._groups():
        update = m[sl] / v[sl].sqrt().add_(group["eps"])
        if group["weight_decay"]:
            update.add_(p[sl], alpha=group["weight_decay"])
        p[sl].add_(update, alpha=-group["lr"])
