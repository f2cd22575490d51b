"""Adam-family moment updates shared by 1-bit Adam, 1-bit LAMB and 0/1 Adam, per parameter group."""

from __future__ import annotations

import math

import torch

from ..algorithms.agreement import Step
from .base import CompressedOptimizer
from .channel import ErrorFeedbackChannel
from .silent import zero_where


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


def adam_step(opt: CompressedOptimizer, p: torch.Tensor, m: torch.Tensor, v: torch.Tensor, steps: int = 0,
              variance_steps: int = 0, denom: torch.Tensor | None = None) -> None:
    """p -= lr * (m / (sqrt(v) + eps) + weight_decay * p), with each group's hyperparameters.

    With ``steps`` > 0 (bias correction, as torch.optim.Adam's): m is divided by 1 - b1^steps, and
    v by 1 - b2^variance_steps where ``variance_steps`` > 0 (``preconditioner``). ``denom``: that preconditioner,
    where the caller computed it this step from the same v (1-bit Adam's compressed step sends by it: computed
    twice, its square root took 1.8 ms of a 24 ms step at 4.2M parameters on one CPU rank).
    """
    if denom is None:
        denom = preconditioner(opt, v, variance_steps=variance_steps)
    for group, sl in opt._groups():
        update = m[sl] / denom[sl]
        if steps:
            update.div_(1 - group["betas"][0] ** steps)
        if group["weight_decay"]:
            update.add_(p[sl], alpha=group["weight_decay"])
        p[sl].add_(update, alpha=-group["lr"])


def preconditioner(opt: CompressedOptimizer, v: torch.Tensor, out: torch.Tensor | None = None,
                   variance_steps: int = 0) -> torch.Tensor:
    """sqrt(v) + eps with each group's eps, in ``out`` (None: a scratch buffer): what turns m into Adam's update
    m / (sqrt(v) + eps).

    With ``variance_steps`` k > 0, v is bias-corrected first, as torch.optim.Adam's:
    sqrt(v) / sqrt(1 - b2^k) + eps (k: the number of updates v has had).
    """
    denom = opt.workspace.get("optim.denom", v.numel(), torch.float32, v.device) if out is None else out
    for group, sl in opt._groups():
        torch.sqrt(v[sl], out=denom[sl])
        if variance_steps:
            denom[sl].div_(math.sqrt(1 - group["betas"][1] ** variance_steps))
        denom[sl].add_(group["eps"])
    return denom


def send_preconditioned(channel: ErrorFeedbackChannel, local: torch.Tensor, out: torch.Tensor, denom: torch.Tensor,
                        silent: torch.Tensor | None, step: Step | None = None) -> torch.Tensor:
    """``out`` = denom * (1-bit average of local / denom), zero where ``silent`` (``compress="update"``; None: no
    coordinate is silent, ``silent.silent_coordinates``).

    1. local /= denom (in place), zero where ``silent``: Adam's update direction, whose
       coordinates are of one order of magnitude, so one 1-bit scale fits them all and a
       coordinate with a tiny variance no longer multiplies the compression error by 1/eps.
    2. The error-compensated 1-bit average of it through ``channel`` (its error feedback
       then works on update directions), at the caller's ``step`` (``Channel.__call__``).
    3. out *= denom: back to the quantity the caller keeps (a momentum).
    """
    zero_where(local.div_(denom), silent)
    channel.average_except(local, out, silent, step)
    return out.mul_(denom)


def floor_variance(opt: CompressedOptimizer, m: torch.Tensor, v: torch.Tensor, steps: int = 0,
                   variance_steps: int = 0) -> None:
    """v = max(v, c * m^2), c = (1-b2) / (1-b1)^2 per group: no step larger than Adam's largest.

    With bias correction (``steps`` t and ``variance_steps`` k > 0, as ``adam_step``'s) the bound
    holds for the corrected moments: c is multiplied by (1 - b2^k) / (1 - b1^t)^2.

    Adam's |m / sqrt(v)| peaks at (1-b1) / sqrt(1-b2) (3.16 at the default betas) when one
    gradient follows a silent history; a variance that is refreshed only now and then (0/1
    Adam) has no such bound, and a coordinate whose gradient grows since the refresh takes
    steps up to |g| / eps. The floor restores the bound. It needs m and v equal on every
    rank, so that v stays so; it leaves v = 0 where m = 0.
    """
    for group, sl in opt._groups():
        b1, b2 = group["betas"]
        c = (1 - b2) / (1 - b1) ** 2
        if steps and variance_steps:
            c *= (1 - b2 ** variance_steps) / (1 - b1 ** steps) ** 2
        torch.maximum(v[sl], m[sl].square().mul_(c), out=v[sl])
