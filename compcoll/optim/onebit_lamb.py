"""1-bit LAMB (Li et al. 2021): LAMB in warmup, then 1-bit momentum with per-step (or frozen, factored) trust ratios."""

from __future__ import annotations

import math
from typing import Any

import torch

from .. import codecs
from ..comm import Communicator
from .base import CompressedOptimizer, Params, StateBuffer
from .moments import averaged_moments, local_momentum, preconditioner, send_preconditioned
from .settings import (check_hyperparameters, compression_settings, is_number, layout_settings, variance_frozen,
                       warmup_steps)
from .silent import silent_coordinates

TRUST_RATIOS = ("fresh", "frozen")


class OneBitLamb(CompressedOptimizer):
    """1-bit LAMB, standing alone: call ``loss.backward(); opt.step()`` on local gradients.

    Layers are the parameters; ||.|| is a float64 norm in a fixed order. Per step:
    1. Warmup (the first ``freeze_step`` steps): g_avg = exact average of g over ranks;
       m = b1*m + (1-b1)*g_avg; v = b2*v + (1-b2)*g_avg^2 (at the last warmup step
       v_fresh = v). Per layer: u = m/(sqrt(v)+eps) + wd*p; c = clip(||p||/||u||,
       min_coeff, max_coeff) (1 if either norm is 0); where c != 1 the frozen ratio
       follows c_frozen = coeff_beta*c_frozen + (1-coeff_beta)*c; p -= lr*c*u.
    2. Compression: m_last = m, then one error-compensated 1-bit average C of the whole
       vector (hierarchical across several nodes). ``compress="update"`` (default):
       m = d * C((b1*m + (1-b1)*g) / d), d = sqrt(v)+eps, the update direction, whose
       coordinates share one scale whatever the layer. ``"momentum"`` (DeepSpeed's): at its
       first step each layer gets a scaling s_l = mean_k(r_k) / r_l, r_l = ||m_l|| /
       sqrt(numel_l), so that all layers' momenta share the one scale fairly, and
       m = C((b1*m + (1-b1)*g) * s_l) / s_l per layer. Coordinates whose frozen v is 0
       are kept at m = 0.
    3. Per layer: u = m/(sqrt(v)+eps) + wd*p. ``trust_ratio="fresh"`` (default): LAMB's
       own ratio, c = clip(||p||/||u||, min_coeff, max_coeff) as in warmup, computed
       every step from the compressed m, which every rank holds alike; p -= lr*c*u.
       ``"frozen"`` (the paper's and DeepSpeed's): the reconstructed gradient
       g~ = (m - b1*m_last)/(1-b1) updates a fresh variance
       v_fresh = b2*v_fresh + (1-b2)*g~^2; f = max(denominator / (sqrt(v_fresh)+eps))
       (blended towards 1 by the share of the weight decay in ||u|| when wd > 0),
       clipped to [factor_min, factor_max] and to (1 -/+ factor_threshold) times the
       last step's f; p -= lr * c_frozen * f * u.
    4. ``variance_refresh=k`` (k > 0): the k-th, 2k-th, ... step of the compression phase
       is a warmup step instead (step 1: the exact average of g, m and v updated, and
       v_fresh = v), so v follows gradients whose scale drifts; the error buffers keep
       their residue across it. Each costs one float32 allreduce.
    5. ``layer_scales=True``: step 2's C takes one 1-bit scale per layer (a channel per
       parameter, ``LayeredChannel``) instead of one for the whole vector.
    Why "fresh" by default: the 1-bit momentum flips sign from step to step, so g~ is
    mostly compression noise, v_fresh outgrows v and f sinks to factor_min, halving the
    step; and the frozen ratio cannot follow ||p||. On the LM of ``bench/convergence``
    (eps 1e-8) 1-bit LAMB went from +17.1% to +7.2% of LAMB's validation loss, on digits
    at eps 1e-8 from 98.06% to 98.89% (docs/guides/optimizers.md).
    As DeepSpeed's, no bias correction; unlike DeepSpeed's, no step is spent on setup,
    a layer with zero momentum gets s_l = 1 rather than a division by zero, and the state
    (frozen ratios, factors, scalings, error buffers) is all in ``state_dict``.
    ``lamb_coeffs`` holds the last step's per-layer coefficients.

    Tuning: ``CompressedOptimizer`` lists the knobs in the order to try them and what each
    costs in bytes.

    Args:
        params: as for ``OneBitAdam``.
        lr: as for ``OneBitAdam``.
        freeze_step: as for ``OneBitAdam`` (>= 1; a float in (0, 1): a share of ``total_steps``).
        betas: as for ``OneBitAdam``.
        eps: as for ``OneBitAdam``.
        weight_decay: as for ``OneBitAdam``.
        comm: as for ``OneBitAdam``.
        ranks_per_node: as for ``OneBitAdam``.
        hierarchical: as for ``OneBitAdam``.
        nonfinite: as for ``OneBitAdam``.
        compress: as for ``OneBitAdam``.
        total_steps: as for ``OneBitAdam``.
        scale: as for ``OneBitAdam`` ("l1" by default): with "l2" and frozen ratios, eps = 1e-8
            diverged on digits after the warmup; with "l1" and fresh ratios it ends level with
            LAMB (docs/guides/optimizers.md).
        max_coeff: the trust ratio's upper clip.
        min_coeff: the trust ratio's lower clip.
        trust_ratio: "fresh" (LAMB's ratio every step) or "frozen" (the warmup's ratio
            times the variance factor, as the paper and DeepSpeed) in the compression phase.
        coeff_beta: ("frozen") decay of the frozen trust ratio's moving average
            (1/(1-coeff_beta) should not exceed freeze_step).
        factor_max: ("frozen") the compression-phase factor's upper clip.
        factor_min: ("frozen") the compression-phase factor's lower clip.
        factor_threshold: ("frozen") how much the factor may change from one step to the next.
        protocol: as for ``OneBitAdam``.
        variance_refresh: every this many compression-phase steps, one exact step that
            refreshes v (step 4; 0, the default: v stays frozen, as in the paper). On the LM
            of ``bench/convergence``, whose gradients grow after the freeze, refreshing every
            16 steps with ``protocol="allgather"`` took 1-bit LAMB from +6.4-8.1% to
            +1.2-3.4% of LAMB's validation loss at 3.96x fewer bytes (docs/guides/optimizers.md).
        layer_scales: one 1-bit scale per layer (step 5; False, the default: one per vector, as
            the paper). With ``protocol="allgather"`` and ``variance_refresh=20`` it ended
            +0.5-1.4% above LAMB on that LM at 4.1x fewer bytes (docs/guides/optimizers.md).
    """

    _scalar_names = ("scaled",)
    _carried = ("exp_avg", "exp_avg_sq", "exp_avg_sq_fresh")
    exp_avg = StateBuffer()
    exp_avg_sq = StateBuffer()
    exp_avg_sq_fresh = StateBuffer()
    coeff_freeze = StateBuffer("lamb_coeff_freeze")
    last_factor = StateBuffer()
    scaling_coeff = StateBuffer()

    def __init__(
        self,
        params: Params,
        lr: float = 1e-3,
        freeze_step: int | float = 100000,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 0.0,
        max_coeff: float = 10.0,
        min_coeff: float = 0.01,
        coeff_beta: float = 0.9,
        factor_max: float = 4.0,
        factor_min: float = 0.5,
        factor_threshold: float = 0.1,
        comm: Communicator | None = None,
        *,
        ranks_per_node: int | str | None = "auto",
        hierarchical: bool | None = None,
        nonfinite: str = "skip",
        compress: str = "update",
        scale: str = "l1",
        trust_ratio: str = "fresh",
        protocol: str = "auto",
        variance_refresh: int = 0,
        layer_scales: bool = False,
        total_steps: int | None = None,
    ) -> None:
        what = type(self).__name__

        def settings() -> dict[str, Any]:
            check_hyperparameters(what, lr, betas, eps, weight_decay)
            if isinstance(variance_refresh, bool) or not isinstance(variance_refresh, int) or variance_refresh < 0:
                raise ValueError(f"{what}: variance_refresh must be an integer >= 0 (0: never), got "
                                 f"{variance_refresh!r}")
            if not isinstance(layer_scales, bool):
                raise ValueError(f"{what}: layer_scales must be True or False, got {layer_scales!r}")
            if trust_ratio not in TRUST_RATIOS:
                raise ValueError(f"{what}: trust_ratio must be one of {', '.join(TRUST_RATIOS)}, got {trust_ratio!r}")
            coefficients = (min_coeff, max_coeff, factor_min, factor_max, coeff_beta, factor_threshold)
            if not all(is_number(c) for c in coefficients) or not 0 < min_coeff <= max_coeff \
                    or not 0 < factor_min <= factor_max or not 0 <= coeff_beta < 1:
                raise ValueError(
                    f"{what}: need 0 < min_coeff <= max_coeff, 0 < factor_min <= factor_max and 0 <= coeff_beta < 1, "
                    f"got {min_coeff}, {max_coeff}, {factor_min}, {factor_max}, {coeff_beta}"
                )
            if not factor_threshold >= 0:
                raise ValueError(f"{what}: factor_threshold must be >= 0, got {factor_threshold}")
            return {**compression_settings(what, compress, scale, protocol),
                    "freeze_step": warmup_steps(what, "freeze_step", freeze_step, total_steps, least=1),
                    "trust_ratio": trust_ratio, "variance_refresh": variance_refresh, "layer_scales": layer_scales,
                    "coeff_beta": coeff_beta, "factor_max": factor_max, "factor_min": factor_min,
                    "factor_threshold": factor_threshold, **layout_settings(what, ranks_per_node, hierarchical)}

        defaults = dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay,
                        max_coeff=max_coeff, min_coeff=min_coeff)
        super().__init__(params, defaults, comm, nonfinite, settings)
        self.freeze_step = self.settings["freeze_step"]  # its warm-up estimates v: at least 1 step
        self.compress = compress
        self.trust_ratio = trust_ratio
        self.coeff_beta, self.factor_max, self.factor_min = coeff_beta, factor_max, factor_min
        self.factor_threshold = factor_threshold
        self.variance_refresh = variance_refresh
        self._buffer("exp_avg")
        self._buffer("exp_avg_sq")
        self._buffer("exp_avg_sq_fresh")
        self._buffer("lamb_coeff_freeze", "layer", torch.float64)
        self._buffer("last_factor", "layer", torch.float64, fill=1.0)
        self._buffer("scaling_coeff", "layer", torch.float64)
        self.scaled = False
        self._lengths: torch.Tensor | None = None
        self.lamb_coeffs: list[float] = []
        self._error_feedback(ranks_per_node, hierarchical, scale, protocol, layer_scales)

    @property
    def compressing(self) -> bool:
        """Whether the next step communicates 1-bit momentum (warmup is over)."""
        return self.steps >= self.freeze_step

    @property
    def refreshing(self) -> bool:
        """Whether the next step is a compression-phase step that refreshes v exactly (``variance_refresh``)."""
        k = self.variance_refresh
        return self.compressing and k > 0 and (self.steps - self.freeze_step) % k == k - 1

    def _growth_refused(self) -> str:
        return variance_frozen("freeze_step", self.freeze_step) if self.compressing else ""

    def _update(self, grad: torch.Tensor) -> None:
        if self.compressing and not self.refreshing:
            self._compressed_step(grad)
        else:
            self._warmup_step(grad)

    def _warmup_step(self, grad: torch.Tensor) -> None:
        m, v, p = self.exp_avg, self.exp_avg_sq, self.flat.data
        averaged_moments(self, grad, m, v)
        if self.steps + 1 == self.freeze_step or self.refreshing:
            self.exp_avg_sq_fresh.copy_(v)
        update = self._adam_update(m, preconditioner(self, v), p)
        self.lamb_coeffs = self._trust_ratios(p, update)
        frozen = self.coeff_freeze.tolist()
        for index, coeff in enumerate(self.lamb_coeffs):
            if coeff != 1.0:
                frozen[index] = self.coeff_beta * frozen[index] + (1 - self.coeff_beta) * coeff
        self.coeff_freeze.copy_(torch.tensor(frozen, dtype=torch.float64))
        self._apply(p, update, self.lamb_coeffs)

    def _compressed_step(self, grad: torch.Tensor) -> None:
        m, v, p = self.exp_avg, self.exp_avg_sq, self.flat.data
        last = None
        if self.trust_ratio == "frozen":
            last = self.workspace.get("optim.last", m.numel(), torch.float32, m.device)
            last.copy_(m)
        local = local_momentum(self, grad, m)
        denom = preconditioner(self, v)  # v is frozen: one denominator serves the whole step
        if self.compress == "update":
            send_preconditioned(self.channel, local, m, denom, silent_coordinates(v), self._tag())
        else:
            self._send_scaled(local)
        if last is None:
            update = self._adam_update(m, denom, p)
            self.lamb_coeffs = self._trust_ratios(p, update)
        else:
            update = self._factored_update(m, last, denom, p)
        self._apply(p, update, self.lamb_coeffs)

    def _trust_ratios(self, p: torch.Tensor, update: torch.Tensor) -> list[float]:
        """Per layer c = clip(||p|| / ||u||, min_coeff, max_coeff), 1 where either norm is 0 (float64 norms)."""
        coeffs = []
        for seg, (weight_sq, update_sq) in zip(self.flat.segments, self._read_sums_of_squares((p, update))):
            group = self.param_groups[seg.group]
            weight_norm, update_norm = math.sqrt(weight_sq), math.sqrt(update_sq)
            coeff = 1.0
            if weight_norm and update_norm:
                coeff = min(max(weight_norm / update_norm, group["min_coeff"]), group["max_coeff"])
            coeffs.append(coeff)
        return coeffs

    def _factored_update(self, m: torch.Tensor, last: torch.Tensor, denom: torch.Tensor,
                         p: torch.Tensor) -> torch.Tensor:
        """``trust_ratio="frozen"``'s step 3: u in a scratch buffer, and ``lamb_coeffs`` = c_frozen * f per layer."""
        fresh = self.exp_avg_sq_fresh
        for group, sl in self._groups():
            b1, b2 = group["betas"]
            rebuilt = codecs.divide_(m[sl] - last[sl] * b1, 1 - b1)
            fresh[sl].mul_(b2).addcmul_(rebuilt, rebuilt, value=1 - b2)
        factors = last  # free from here on: it holds denominator / (sqrt(v_fresh) + eps)
        torch.div(denom, preconditioner(self, fresh, factors), out=factors)
        table = torch.zeros(3, len(self.flat.segments), dtype=torch.float64, device=p.device)
        update = self.workspace.get("optim.update", p.numel(), torch.float32, p.device)
        torch.div(m, denom, out=update)
        table[0] = torch.segment_reduce(factors, "max", lengths=self._segment_lengths())
        decayed = any(group["weight_decay"] for group in self.param_groups)
        if decayed:
            codecs.segment_sumsq(update, self.flat.bounds, table[1])
        for group, sl in self._groups():
            if group["weight_decay"]:
                update[sl].add_(p[sl], alpha=group["weight_decay"])
        if decayed:
            codecs.segment_sumsq(update, self.flat.bounds, table[2])
        rows = table.t().tolist()
        frozen, last_factors = self.coeff_freeze.tolist(), self.last_factor.tolist()
        self.lamb_coeffs = []
        for index, (seg, (factor, prelim_sq, update_sq)) in enumerate(zip(self.flat.segments, rows)):
            if not seg.numel:
                self.lamb_coeffs.append(0.0)
                continue
            if self.param_groups[seg.group]["weight_decay"]:
                update_norm = math.sqrt(update_sq)
                ratio = min(1.0, math.sqrt(prelim_sq) / update_norm) if update_norm else 1.0
                factor = factor * ratio + (1.0 - ratio)
            factor = min(max(factor, self.factor_min), self.factor_max)
            factor = min(max(factor, last_factors[index] * (1.0 - self.factor_threshold)),
                         last_factors[index] * (1.0 + self.factor_threshold))
            last_factors[index] = factor
            self.lamb_coeffs.append(frozen[index] * factor)
        self.last_factor.copy_(torch.tensor(last_factors, dtype=torch.float64))
        return update

    def _segment_lengths(self) -> torch.Tensor:
        """Every layer's length, an int64 tensor on the parameters' device (made again after a move)."""
        device = self.flat.device
        if self._lengths is None or self._lengths.device != device:
            self._lengths = torch.tensor([seg.numel for seg in self.flat.segments], device=device)
        return self._lengths

    def _adam_update(self, m: torch.Tensor, denom: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
        """u = m / denom + weight_decay * p per group (denom = sqrt(v) + eps), in a scratch buffer."""
        update = self.workspace.get("optim.update", p.numel(), torch.float32, p.device)
        torch.div(m, denom, out=update)
        for group, sl in self._groups():
            if group["weight_decay"]:
                update[sl].add_(p[sl], alpha=group["weight_decay"])
        return update

    def _apply(self, p: torch.Tensor, update: torch.Tensor, coeffs: list[float]) -> None:
        """p_l -= lr * coeff_l * u_l for every layer l (queued on the device; no host round trip)."""
        for (seg, p_l), coeff in zip(self.flat.views(p), coeffs):
            p_l.add_(update[seg.start:seg.stop], alpha=-self.param_groups[seg.group]["lr"] * coeff)

    def _read_sums_of_squares(self, flats: tuple[torch.Tensor, ...]) -> list[list[float]]:
        """Every layer's float64 sum of squares in each of ``flats`` (``codecs.sumsq``'s fixed order), by layer.

        One ``codecs.segment_sumsq`` call per flat vector for all layers; the sums cross to the host together, in
        one transfer.
        """
        table = torch.empty(len(flats), len(self.flat.segments), dtype=torch.float64, device=self.flat.device)
        for row, flat in zip(table, flats):
            codecs.segment_sumsq(flat, self.flat.bounds, row)
        return table.t().tolist()

    def _send_scaled(self, local: torch.Tensor) -> None:
        """m = C(local * s_l) / s_l per layer (``compress="momentum"``), the scalings set at the first call."""
        if not self.scaled:
            self._set_scaling()
        scalings = self.scaling_coeff.tolist()
        for (seg, local_l), scaling in zip(self.flat.views(local), scalings):
            local_l.mul_(scaling)
        self.channel.average_except(local, self.exp_avg, silent_coordinates(self.exp_avg_sq), self._tag())
        for (seg, m_l), scaling in zip(self.flat.views(self.exp_avg), scalings):
            codecs.divide_(m_l, scaling)

    def _set_scaling(self) -> None:
        """s_l = mean_k(r_k) / r_l with r_l = ||m_l|| / sqrt(numel_l); 1 for a layer with zero momentum."""
        sums = self._read_sums_of_squares((self.exp_avg,))
        ratios = [math.sqrt(total) / math.sqrt(seg.numel) if seg.numel else 0.0
                  for seg, (total,) in zip(self.flat.segments, sums)]
        united = sum(ratios) / len(ratios)
        self.scaling_coeff.copy_(torch.tensor([united / r if r else 1.0 for r in ratios], dtype=torch.float64))
        self.scaled = True
