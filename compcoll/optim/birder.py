"""Birder (Wang et al. 2023): 1-bit binary-randomized ratio of momentum to mean |gradient|, hierarchical, no warmup."""

from __future__ import annotations

import numbers
from typing import Any

import torch

from ..algorithms.birder import hierarchical_allreduce
from ..comm import Communicator
from .base import CompressedOptimizer, Params, StateBuffer
from .live import add_fresh
from .settings import check_hyperparameters, layout_settings


class Birder(CompressedOptimizer):
    """Birder, standing alone: call ``loss.backward(); opt.step()`` on local gradients.

    Per step, t = the number of steps taken so far (g: this rank's gradient):
    1. One 32-byte allgather per rank: every rank learns whether some rank's gradient is
       not finite (then all skip the step) and whether some rank saw a gradient on a
       coordinate none had seen before, and how many; if so, the ranks all-gather the
       indices of those coordinates (or, when many, 1-bit masks) to grow ``live``, the
       coordinates that have had a gradient on any rank.
    2. m = b1*m + (1-b1)*g; b = b2*b + (1-b2)*|g|; r = m / b (0 where b = 0), so
       |r| <= 1 when b1 = b2.
    3. R = hierarchical_allreduce(r, seed, step=t): three unbiased binary
       randomizations, 1 bit per element on every link (docs/architecture.md,
       "Algorithms"); intra- and inter-node stages follow the node layout
       (``ranks_per_node``). R = 0 off ``live``,
       so coordinates nobody has a gradient for stay untouched.
    4. p -= lr * (R + weight_decay * p).
    No warmup and no error buffers; m and b are this rank's own (from local gradients),
    R and p are the same on every rank. The random stream is fixed by (seed, t), so a
    resumed run draws the same bits. Because m / b comes from each rank's share of the
    batch, Birder wants that share not to be tiny: on the LM of bench/convergence, a global
    batch of 64 split over 16 and 64 ranks, Birder with the exact average of m / b ended
    10.9% and 17.6% above its 2-rank run, while its 1-bit compression cost 0.2% and -0.5%
    against that exact form at the same n (docs/guides/scale.md).

    Tuning: ``CompressedOptimizer`` lists the knobs in the order to try them and what each
    costs in bytes.

    Args:
        params: parameters or parameter groups: dense float32, float16 or bfloat16, all on one CPU or CUDA device.
        lr: learning rate (each step moves a coordinate by about lr: sign-like updates).
        betas: (b1, b2) for m and b.
        weight_decay: decoupled weight decay.
        comm: the communicator; None means ``compcoll.get_default()``.
        ranks_per_node: the node layout ("auto", the default: discovered from hostnames).
        seed: the random seed of the binary randomization.
        nonfinite: "skip" or "raise".
    """

    _scalar_names = ()
    _rank_own = ("exp_avg", "exp_avg_abs", "seen")
    exp_avg = StateBuffer()
    exp_avg_abs = StateBuffer()
    seen = StateBuffer()
    live = StateBuffer()

    def __init__(
        self,
        params: Params,
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.9),
        weight_decay: float = 0.0,
        comm: Communicator | None = None,
        *,
        ranks_per_node: int | str | None = "auto",
        seed: int = 0,
        nonfinite: str = "skip",
    ) -> None:
        what = type(self).__name__

        def settings() -> dict[str, Any]:
            check_hyperparameters(what, lr, betas, None, weight_decay)
            if isinstance(seed, bool) or not isinstance(seed, numbers.Integral):
                raise ValueError(f"{what}: seed must be an integer, got {seed!r}")
            return {**layout_settings(what, ranks_per_node), "seed": int(seed)}

        super().__init__(params, dict(lr=lr, betas=betas, weight_decay=weight_decay), comm, nonfinite,
                         settings)
        self.ranks_per_node = ranks_per_node
        self.seed = self.settings["seed"]
        self._buffer("exp_avg")
        self._buffer("exp_avg_abs")
        self._buffer("seen", dtype=torch.bool)
        self._buffer("live", dtype=torch.bool)

    def _update(self, grad: torch.Tensor) -> None:
        seen = self.seen | (grad != 0)
        fresh = int((seen & ~self.live).sum())
        counts = [int(c) for c in self._check_finite(grad, (fresh,))[:, 0].tolist()]
        self.seen.copy_(seen)
        if any(counts):
            add_fresh(self.live, self.seen, counts, self.comm)
        m, b, p = self.exp_avg, self.exp_avg_abs, self.flat.data
        ratio = self.workspace.get("optim.local", grad.numel(), torch.float32, grad.device)
        for group, sl in self._groups():
            b1, b2 = group["betas"]
            m[sl].mul_(b1).add_(grad[sl], alpha=1 - b1)
            b[sl].mul_(b2).add_(grad[sl].abs(), alpha=1 - b2)
            torch.div(m[sl], b[sl], out=ratio[sl])
        ratio.masked_fill_(b == 0, 0.0)
        mean = self._combine(ratio, self.workspace.get("optim.average", grad.numel(), torch.float32, grad.device))
        mean.masked_fill_(~self.live, 0.0)
        for group, sl in self._groups():
            if group["weight_decay"]:
                mean[sl].add_(p[sl], alpha=group["weight_decay"])
            p[sl].add_(mean[sl], alpha=-group["lr"])

    def _combine(self, ratio: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        """Step 3: the ranks' 1-bit estimate of the average of ``ratio``, into ``out``.

        The one place Birder compresses: the convergence bench's uncompressed baseline
        (``bench/convergence/job.py``, ``ExactBirder``) replaces it with the exact average.
        """
        return hierarchical_allreduce(ratio, self.comm, ranks_per_node=self.ranks_per_node, seed=self.seed,
                                      step=self.steps, out=out)
