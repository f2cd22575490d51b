"""0/1 Adam (Lu et al. 2022): variance refreshed at doubling intervals, 1-bit steps, then 1-bit synced local steps."""

from __future__ import annotations

from typing import Any

import torch

from .. import codecs
from ..comm import Communicator
from .base import CompressedOptimizer, Params, StateBuffer
from .moments import adam_step, floor_variance, local_momentum, preconditioner, send_preconditioned
from .settings import (bias_correction_setting, check_hyperparameters, compression_settings, layout_settings,
                       variance_frozen,
                       warmup_steps)
from .silent import silent_coordinates, zero_where


class ZeroOneAdam(CompressedOptimizer):
    """0/1 Adam, standing alone: call ``loss.backward(); opt.step()`` on local gradients.

    Steps are numbered s = 1, 2, ... Per step:
    1. Variance phase (s <= var_freeze_step). If s is a multiple of ``var_interval``:
       g_avg = exact average of g over ranks, v = b2*v + (1-b2)*g_avg^2,
       m = b1*m + (1-b1)*g_avg; after ``var_update_scaler`` such refreshes the interval
       doubles. Otherwise, with C the error-compensated 1-bit average and d = sqrt(v)+eps:
       m = d * C((b1*m + (1-b1)*g) / d) (``compress="update"``, default: the momentum's
       update direction, as 1-bit Adam sends it; error feedback then works on a smooth
       quantity, not on raw gradients), or m = b1*m + (1-b1)*C(g) (``"momentum"``,
       DeepSpeed's). Then v = max(v, m^2 (1-b2)/(1-b1)^2) (the
       variance floor: no step beyond Adam's largest, (1-b1)/sqrt(1-b2), however stale v
       is; ``moments.floor_variance``) and p -= lr*(m/(sqrt(v)+eps) + wd*p).
    2. Local phase (s > var_freeze_step; v frozen): at the first local step after a
       synchronisation (or the variance phase, or a load) p_sync = p, the parameters as they
       are then; m = b1*m + (1-b1)*g with the local
       gradient; p -= lr*u_s and the accumulator a += lr*u_s, u_s = m/(sqrt(v)+eps) + wd*p;
       no vector is sent. Every ``local_interval`` steps the ranks synchronise: the
       accumulated step a (``"update"``) or a*d (``"momentum"``) goes through C (error
       buffers reset once when the phase starts, since they now hold another quantity);
       from its mean, a~ = mean (or mean/d), p = p_sync - a~ from the parameters p_sync of
       the last synchronisation, m = a~*d / (the group's sum of lr since then), and the
       variance floor again (m and v are the same on every rank there). The
       interval doubles every ``local_step_scaler`` steps, up to ``local_step_clipper``.
    3. ``bias_correction=True``: every m above is divided by 1 - b1^s and every v by
       1 - b2^k (k: the refreshes v has had), as torch.optim.Adam corrects them, in d, the
       steps, the floor's bound and the m rebuilt at a synchronisation (times 1 - b1^s).
       Without it (DeepSpeed's numerics) v after k refreshes is 1 - b2^k of its level: 3.9%
       after the 40 refreshes of an 80-step variance phase, so each step is up to 5.1x
       torch's Adam at the same lr (docs/guides/scale.md, "Learning rates").
    Replicas are bit-identical after every step of phase 1 and after every
    synchronisation (``synchronized`` is True then); between synchronisations each rank
    trains its own copy, as the algorithm intends. Unlike DeepSpeed's, the first step
    updates the parameters and synchronised parameters are rebuilt from the common
    p_sync (DeepSpeed subtracts the local steps again, which leaves rounding differences
    between replicas). Coordinates whose v is 0 (no gradient at any refresh so far) keep
    m = 0, no momentum step and no error-feedback residue. In the local phase one
    32-byte allgather per step lets every rank skip a step with a non-finite gradient alike.

    Tuning: ``CompressedOptimizer`` lists the knobs in the order to try them and what each
    costs in bytes.

    Args:
        params: as for ``OneBitAdam``.
        lr: as for ``OneBitAdam``.
        betas: as for ``OneBitAdam``.
        eps: as for ``OneBitAdam``.
        weight_decay: as for ``OneBitAdam``.
        comm: as for ``OneBitAdam``.
        ranks_per_node: as for ``OneBitAdam``.
        hierarchical: as for ``OneBitAdam``.
        nonfinite: as for ``OneBitAdam``.
        compress: as for ``OneBitAdam``.
        scale: as for ``OneBitAdam``.
        protocol: as for ``OneBitAdam``.
        var_freeze_step: the last step of the variance phase; a float in (0, 1) is that
            share of ``total_steps``.
        var_update_scaler: refreshes of v per interval before the interval doubles.
        local_step_scaler: local-phase steps per doubling of the synchronisation interval.
        local_step_clipper: the largest synchronisation interval (16, DeepSpeed's, suits runs of 10^5 steps
            with a large batch per rank). Where each rank's share of the batch is small, local steps grow noisy:
            on the LM of bench/convergence, a global batch of 64 split over 64 ranks, 2 ended 6.7% above Adam
            and 1 (a synchronisation at every local-phase step, 1/29 of the ring's bytes) 0.6% above
            (docs/guides/scale.md).
        total_steps: the run's number of optimizer steps, for a ``var_freeze_step`` given as a share.
        bias_correction: as for ``OneBitAdam`` (step 3; False, the default: DeepSpeed's numerics).
    """

    _scalar_names = ("var_interval", "var_counter", "local_interval", "local_counter", "pending")
    _carried = ("exp_avg", "exp_avg_sq")
    _carried_schedule = {"var_interval": "var_interval", "var_counter": "var_counter",
                         "local_step_interval": "local_interval", "local_step_counter": "local_counter"}
    exp_avg = StateBuffer()
    exp_avg_sq = StateBuffer()
    accumulator = StateBuffer("momentum_accumulator")
    synced_params = StateBuffer()
    lr_sums = StateBuffer()

    def __init__(
        self,
        params: Params,
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 0.0,
        var_freeze_step: int | float = 100000,
        var_update_scaler: int = 16,
        local_step_scaler: int = 32678,
        local_step_clipper: int = 16,
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
            schedule = {"var_update_scaler": var_update_scaler, "local_step_scaler": local_step_scaler,
                        "local_step_clipper": local_step_clipper}
            for name, value in schedule.items():
                if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                    raise ValueError(f"{what}: {name} must be a positive integer, got {value!r}")
            return {**compression_settings(what, compress, scale, protocol),
                    **bias_correction_setting(what, bias_correction),
                    "var_freeze_step": warmup_steps(what, "var_freeze_step", var_freeze_step, total_steps, least=1),
                    **schedule, **layout_settings(what, ranks_per_node, hierarchical)}

        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay), comm, nonfinite,
                         settings)
        self.compress = compress
        self.bias_correction = bias_correction
        self.var_freeze_step = self.settings["var_freeze_step"]
        self.var_update_scaler = var_update_scaler
        self.local_step_scaler = local_step_scaler
        self.local_step_clipper = local_step_clipper
        self.var_interval, self.var_counter = 1, 0
        self.local_interval, self.local_counter = 1, 0
        self.pending = 0
        self._buffer("exp_avg")
        self._buffer("exp_avg_sq")
        self._buffer("momentum_accumulator")
        self._buffer("synced_params")
        self._buffer("lr_sums", "group", torch.float64)
        self._error_feedback(ranks_per_node, hierarchical, scale, protocol)

    @property
    def synchronized(self) -> bool:
        """Whether every rank holds the same parameters now (phase 1, or just after a synchronisation)."""
        return self.pending == 0

    def synchronize(self) -> None:
        """Average the pending local steps now, before evaluating or saving one copy of the model.

        A collective: every rank calls it. It is what a scheduled synchronisation does; the
        schedule of later ones is unchanged.
        """
        if self.pending:
            self._synchronize(silent_coordinates(self.exp_avg_sq), self.steps)
            self.flat.write_back()

    def _drop_local_steps(self) -> None:
        """Forget the local steps taken since the last synchronisation: their accumulated update and lr sums."""
        self.accumulator.zero_()
        self.lr_sums.zero_()
        self.pending = 0

    def _bias_steps(self, s: int, refresh: bool = False) -> tuple[int, int]:
        """(t, k) for ``moments``' bias corrections at step s: (s, the refreshes v has had with this step's), or
        (0, 0) without ``bias_correction``. The interval doubles every ``var_update_scaler`` refreshes, so the
        refreshes before this step are log2(var_interval) * var_update_scaler + var_counter."""
        if not self.bias_correction:
            return 0, 0
        return s, (self.var_interval.bit_length() - 1) * self.var_update_scaler + self.var_counter + refresh

    def _growth_refused(self) -> str:
        """Past the variance phase, or where its last refresh is behind (the next, at the first multiple of
        ``var_interval`` after this step, falls after ``var_freeze_step``): new parameters would get no variance."""
        if self.steps >= self.var_freeze_step:
            return variance_frozen("var_freeze_step", self.var_freeze_step)
        refresh = -(-(self.steps + 1) // self.var_interval) * self.var_interval
        if refresh > self.var_freeze_step:
            return variance_frozen("var_freeze_step", self.var_freeze_step,
                                   f"its variance is refreshed next at step {refresh} (every {self.var_interval} steps "
                                   f"now), after it freezes at step {self.var_freeze_step} (var_freeze_step)")
        return ""

    def _update(self, grad: torch.Tensor) -> None:
        if self.steps + 1 <= self.var_freeze_step:
            self._variance_phase_step(grad, self.steps + 1)
        else:
            self._local_phase_step(grad, self.steps + 1)

    def _variance_phase_step(self, grad: torch.Tensor, s: int) -> None:
        m, v = self.exp_avg, self.exp_avg_sq
        refresh = s % self.var_interval == 0
        t, k = self._bias_steps(s, refresh)
        if refresh or self.compress == "momentum":
            source = self.workspace.get("optim.average", grad.numel(), torch.float32, grad.device)
            if refresh:
                self._average(grad, source)
            else:
                self.channel.average_except(grad, source, silent_coordinates(v), self._tag())
            for group, sl in self._groups():
                b1, b2 = group["betas"]
                if refresh:
                    v[sl].mul_(b2).addcmul_(source[sl], source[sl], value=1 - b2)
                m[sl].mul_(b1).add_(source[sl], alpha=1 - b1)
        else:
            send_preconditioned(self.channel, local_momentum(self, grad, m), m,
                                preconditioner(self, v, variance_steps=k), silent_coordinates(v), self._tag())
        floor_variance(self, m, v, t, k)
        adam_step(self, self.flat.data, m, v, t, k)
        if refresh:
            self.var_counter += 1
            if self.var_counter == self.var_update_scaler:
                self.var_counter, self.var_interval = 0, self.var_interval * 2
        if s == self.var_freeze_step:
            self.channel.reset()

    def _local_phase_step(self, grad: torch.Tensor, s: int) -> None:
        self._check_finite(grad)
        m, v, p, acc = self.exp_avg, self.exp_avg_sq, self.flat.data, self.accumulator
        if not self.pending:
            self.synced_params.copy_(p)
        silent = silent_coordinates(v)
        t, k = self._bias_steps(s)
        denom = preconditioner(self, v, variance_steps=k)
        for index, (group, sl) in enumerate(self._groups()):
            b1 = group["betas"][0]
            m[sl].mul_(b1).add_(grad[sl], alpha=1 - b1)
            update = m[sl] / denom[sl]
            if t:
                update.div_(1 - b1 ** t)
            if silent is not None:
                update.masked_fill_(silent[sl], 0.0)
            if group["weight_decay"]:
                update.add_(p[sl], alpha=group["weight_decay"])
            p[sl].add_(update, alpha=-group["lr"])
            acc[sl].add_(update, alpha=group["lr"])
            self.lr_sums[index] += group["lr"]
        self.pending += 1
        if s % self.local_interval == 0:
            self._synchronize(silent, s)
        self.local_counter += 1
        if self.local_counter == self.local_step_scaler:
            self.local_counter = 0
            self.local_interval = min(self.local_step_clipper, self.local_interval * 2)

    def _synchronize(self, silent: torch.Tensor | None, s: int) -> None:
        """Average the accumulated steps in 1 bit and rebuild p and m (as of step s) from it, identically on every
        rank."""
        m, v, p, acc = self.exp_avg, self.exp_avg_sq, self.flat.data, self.accumulator
        t, k = self._bias_steps(s)
        denom = preconditioner(self, v, variance_steps=k)
        sent = self.workspace.get("optim.local", acc.numel(), torch.float32, acc.device)
        update = self.compress == "update"
        if update:
            self.channel.average_except(zero_where(sent.copy_(acc), silent), acc, silent, self._tag())
            torch.sub(self.synced_params, acc, out=p)
        else:
            self.channel.average_except(torch.mul(acc, denom, out=sent), acc, silent, self._tag())
            torch.sub(self.synced_params, acc / denom, out=p)
        for (group, sl), lr_sum in zip(self._groups(), self.lr_sums.tolist()):
            if lr_sum and update:
                codecs.divide_(torch.mul(acc[sl], denom[sl], out=m[sl]), lr_sum)
            elif lr_sum:
                codecs.divide_(m[sl].copy_(acc[sl]), lr_sum)
            if lr_sum and t:
                m[sl].mul_(1 - group["betas"][0] ** t)
        floor_variance(self, m, v, t, k)
        self.synced_params.copy_(p)
        acc.zero_()
        self.lr_sums.zero_()
        self.pending = 0
