"""1-bit Adam (Tang et al. 2021): Adam in warmup, then error-compensated 1-bit momentum with the variance frozen."""

from __future__ import annotations

import warnings
from typing import Any

import torch

from ..comm import Communicator
from .base import CompressedOptimizer, Params, StateBuffer
from .carry import ADAM_MOMENTS, is_torch_adam_state, load_torch_adam_state
from .moments import adam_step, averaged_moments, local_momentum, preconditioner, send_preconditioned
from .settings import (bias_correction_setting, check_hyperparameters, compression_settings, layout_settings,
                       variance_frozen,
                       warmup_steps)
from .silent import silent_coordinates


class OneBitAdam(CompressedOptimizer):
    """1-bit Adam, standing alone: call ``loss.backward(); opt.step()`` on local gradients.

    Per step, on the flat vector of all parameters (g: this rank's gradient):
    1. Warmup (the first ``freeze_step`` steps): g_avg = exact average of g over ranks
       (uncompressed, bit-identical everywhere); m = b1*m + (1-b1)*g_avg;
       v = b2*v + (1-b2)*g_avg^2.
    2. Compression (afterwards): v stays frozen, d = sqrt(v) + eps; with ``compress="update"``
       (default) m = d * C((b1*m + (1-b1)*g) / d), with ``"momentum"`` (DeepSpeed's)
       m = C(b1*m + (1-b1)*g), where C is the error-compensated 1-bit average
       (docs/architecture.md, "Algorithms"; the hierarchical form when the ranks form
       several nodes), so every rank holds the same m. Sending the update direction keeps
       the compression error of coordinates with a tiny variance from growing by 1/eps:
       with the momentum, eps = 1e-8 diverges on digits (docs/guides/optimizers.md).
    3. p -= lr * (m / (sqrt(v) + eps) + weight_decay * p), per parameter group.
    4. ``bias_correction=True``: steps 2 and 3 take torch.optim.Adam's bias-corrected moments,
       m / (1 - b1^t) at step t and v / (1 - b2^k) with k = min(t, freeze_step), the updates v
       has had (its frozen value is then an estimate of E[g^2], however short the warmup).
    By default, like DeepSpeed's, the update has no bias correction: v is frozen at
    1 - b2^freeze_step of its level (5.8% after 60 warmup steps at b2 = 0.999), so every
    compressed step is 1 / sqrt(that) larger than torch.optim.Adam's at the same lr (4.1x
    there). On the LM of ``bench/scaling`` (60 warmup steps of 400, 2 ranks, seeds 0 / 1 / 2)
    1-bit Adam's best of five lrs was then 5e-4 / 1e-3 / 5e-4, a quarter to a half of Adam's
    (2e-3 / 4e-3 / 4e-3), and ended 6.0 / 2.9 / 4.6% above Adam's best; with the correction
    its best lr was Adam's (2e-3 / 4e-3 / 2e-3) and it ended 4.0 / 5.2 / 2.8% above
    (docs/guides/scale.md, "Learning rates"): the lr means torch's, the gap is the same.
    Unlike DeepSpeed's, the first step
    updates the parameters, and coordinates whose frozen variance is 0 (they never had a
    gradient during warmup: unused embedding rows, always-zero inputs, dead units) are
    kept at m = 0 and out of the error buffers, so the 1-bit noise cannot move them (1-bit
    signs have no zero); no ``exp_avg_mask`` is needed. A coordinate that first gets a
    gradient after ``freeze_step`` has no variance to divide by and stays frozen: warm up
    until every trained coordinate has been seen. A NaN / Inf gradient on any rank skips
    the step on every rank (``nonfinite="skip"``) or raises ``NonFiniteError`` (``"raise"``).

    Bytes per rank and step: warmup 2(n-1)/n * 4 bytes per element (as a ring allreduce),
    compression 2(n-1)/n / 8 bytes per element, 32x fewer.

    Tuning: ``CompressedOptimizer`` lists the knobs in the order to try them and what each
    costs in bytes.

    Args:
        params: parameters or parameter groups: dense float32, float16 or bfloat16, all on one CPU or CUDA device.
        lr: learning rate.
        freeze_step: number of warmup (uncompressed) steps; tune to where v settles,
            typically 15-25% of training. A float in (0, 1) is that share of ``total_steps``
            (``freeze_step=0.15, total_steps=trainer_max_steps``).
        betas: (b1, b2) for m and v.
        eps: added to sqrt(v).
        weight_decay: decoupled weight decay, as DeepSpeed applies it.
        comm: the communicator; None means ``compcoll.get_default()``.
        ranks_per_node: the node layout ("auto", the default: from the hostnames, or
            ``COMPCOLL_RANKS_PER_NODE``; k: k consecutive ranks per node).
        hierarchical: whether to use the hierarchical 1-bit allreduce (None: when the ranks
            form several equal nodes of more than one rank).
        nonfinite: "skip" or "raise".
        compress: "update" or "momentum" (step 2).
        scale: the 1-bit scale, "l1" (default: mean |x|, the least-squares one) or "l2"
            (||x|| / sqrt(d), DeepSpeed's). On the causal LM of bench/convergence (eps 1e-8)
            "l1" ends 0.8% below Adam's validation loss and "l2" 15.3% above
            (docs/guides/optimizers.md); on digits both end level.
        protocol: the 1-bit protocol between the m ranks (flat) or nodes (hierarchical):
            "auto" (default) is "allgather" at m = 2 and "gather_scatter" from 3 on.
            "gather_scatter" compresses each coordinate twice, by its sender and by the rank
            that sums its chunk (DeepSpeed's); "allgather" once, every rank averaging all m
            1-bit estimates, for m / 2 times the bytes per rank: the same at m = 2,
            where it keeps what the second compression loses (docs/guides/scale.md, "Where
            the gap comes from").
        total_steps: the run's number of optimizer steps, for a ``freeze_step`` given as a share.
        bias_correction: torch.optim.Adam's bias correction of m and v (step 4; False, the
            default: DeepSpeed's numerics). With it, the lr means what it means to torch's Adam.
    """

    _scalar_names = ()
    _carried = ADAM_MOMENTS
    exp_avg = StateBuffer()
    exp_avg_sq = StateBuffer()

    def __init__(
        self,
        params: Params,
        lr: float = 1e-3,
        freeze_step: int | float = 100000,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 0.0,
        comm: Communicator | None = None,
        *,
        ranks_per_node: int | str | None = "auto",
        hierarchical: bool | None = None,
        nonfinite: str = "skip",
        compress: str = "update",
        scale: str = "l1",
        protocol: str = "auto",
        total_steps: int | None = None,
        bias_correction: bool = False,
    ) -> None:
        what = type(self).__name__

        def settings() -> dict[str, Any]:
            check_hyperparameters(what, lr, betas, eps, weight_decay)
            return {**compression_settings(what, compress, scale, protocol),
                    **bias_correction_setting(what, bias_correction),
                    "freeze_step": warmup_steps(what, "freeze_step", freeze_step, total_steps),
                    **layout_settings(what, ranks_per_node, hierarchical)}

        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay), comm, nonfinite,
                         settings)
        self.freeze_step = self.settings["freeze_step"]
        self.compress = compress
        self.bias_correction = bias_correction
        self._buffer("exp_avg")
        self._buffer("exp_avg_sq")
        self._error_feedback(ranks_per_node, hierarchical, scale, protocol)

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore what ``state_dict()`` saved (``CompressedOptimizer.load_state_dict``), or carry in the moments and
        step of ``torch.optim.Adam``'s or ``AdamW``'s state (``load_torch_adam_state``, with a warning): a framework
        that resumes a run from a torch Adam's checkpoint switches it to 1-bit Adam."""
        if not is_torch_adam_state(state_dict):
            super().load_state_dict(state_dict)
            return
        load_torch_adam_state(self, state_dict)
        warnings.warn(f"OneBitAdam: carried a torch Adam's state in (its moments and step {self.steps}; the "
                      f"hyperparameters stay this optimizer's, the error buffers start at zero)", stacklevel=2)

    @property
    def compressing(self) -> bool:
        """Whether the next step communicates 1-bit momentum (warmup is over)."""
        return self.steps >= self.freeze_step

    def _growth_refused(self) -> str:
        return variance_frozen("freeze_step", self.freeze_step) if self.compressing else ""

    def _update(self, grad: torch.Tensor) -> None:
        m, v = self.exp_avg, self.exp_avg_sq
        steps = self.steps + 1 if self.bias_correction else 0
        variance_steps = min(steps, self.freeze_step)
        denom = None
        if self.compressing and self.compress == "update":
            denom = preconditioner(self, v, variance_steps=variance_steps)
            send_preconditioned(self.channel, local_momentum(self, grad, m), m, denom, silent_coordinates(v),
                                self._tag())
        elif self.compressing:
            self.channel.average_except(local_momentum(self, grad, m), m, silent_coordinates(v), self._tag())
        else:
            averaged_moments(self, grad, m, v)
        adam_step(self, self.flat.data, m, v, steps, variance_steps, denom)
