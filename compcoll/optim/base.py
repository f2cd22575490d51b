"""The shared frame of compcoll's optimizers: flat parameters, rank-0 broadcast, skipped steps, per-rank state_dict."""

from __future__ import annotations

import warnings
from typing import Any, Callable, Iterable, Iterator

import torch
from torch.distributed.algorithms.join import Join, Joinable, JoinHook

from .. import codecs
from ..algorithms.agreement import Agreement, Option, Step, agree, kept
from ..algorithms.differences import values_option
from ..algorithms.exact import exact_average
from ..algorithms.plan import foreign_state
from ..algorithms.rounds import checked
from ..comm import Communicator, communicator
from ..eager import eager
from ..errors import NonFiniteError
from ..workspace import Workspace
from .channel import Channel, ErrorFeedbackChannel, LayeredChannel
from .flat import FlatParams
from .join import ShadowSteps, join_device, join_process_group
from .replicated import PROBED_STEPS, fingerprint, same_everywhere, warning
from .saved import SECTION, inner_state, parameter_views, torch_layout
from .settings import NONFINITE_POLICIES, SETTINGS, hyperparameters

Params = Iterable[Any]
"""What a torch optimizer takes: parameters, or dicts of parameter groups ("params" and their hyperparameters)."""


class StateBuffer:
    """A named state buffer of a ``CompressedOptimizer``, read from the one dict that owns them all (``_buffers``).

    Subclasses declare ``exp_avg = StateBuffer()`` and create it with ``self._buffer("exp_avg")``;
    the attribute always reads the current tensor, also after the state moved to another device.
    """

    def __init__(self, key: str = "") -> None:
        self.key = key

    def __set_name__(self, owner: type, name: str) -> None:
        self.key = self.key or name

    def __get__(self, opt: "CompressedOptimizer | None", owner: type | None = None) -> Any:
        return self if opt is None else opt._buffers[self.key]


class CompressedOptimizer(torch.optim.Optimizer, Joinable):
    """A ``torch.optim.Optimizer`` that averages over ranks itself; subclasses give ``_update``.

    Construction:
    1. Lay every trained parameter of every group into one flat float32 buffer of master
       weights (``FlatParams``) on the parameters' device, CPU or CUDA, so one step sends one
       vector; every state buffer lives on that device too. The parameters keep their own
       storage and take their masters after every step.
       Parameters with ``requires_grad=False`` stay out: no step touches them (no weight
       decay), as torch's optimizers skip a parameter without a gradient.
       Then check the subclass's arguments (its ``settings`` function). This step is local:
       where it raises TypeError or ValueError on some ranks (bad arguments, a float64
       parameter), they refuse the next step's round (``rounds.checked``), so every rank
       raises at once (the others ``RemoteError`` with the message), none waits out a timeout.
    2. Check that all ranks hold the same groups, shapes, group hyperparameters (lr,
       betas, ...: ranks with another lr would drift apart silently) and settings (what the
       subclass's ``settings`` returned, and ``nonfinite``: a rank with another
       ``freeze_step`` or ``nonfinite`` would run other collectives); one small allgather, a
       ``RankMismatchError`` on every rank otherwise, naming the first that differs and the
       ranks that hold each value, and broadcast the buffer from rank 0,
       so replicas start identical. The agreed settings stay in ``settings``.

    ``add_param_group`` (a collective once built) adds a group to train from the next step
    on, while the algorithm can still give new parameters a variance (in the warm-up; any
    time for Birder): Lightning's ``BaseFinetuning`` unfreezes layers so.

    ``step()``:
    1. Follow the parameters (``_follow_parameters``): whatever a framework or the caller
       did to them since the last step (``model.to(device)``, ``param.data = ...``, an
       in-place ``load_state_dict`` or edit, ``.half()``), this step trains them, as if the
       optimizer had been built after; the state follows a move to another device.
       Then gather the local gradients into one flat float32 vector (zeros where ``p.grad``
       is None), unscaled when a ``torch.amp.GradScaler`` drives the step
       (``_local_gradient``). A gradient that cannot be used (sparse), or parameters that
       cannot be followed (another set, another shape, one frozen or unfrozen since), make
       this rank refuse the step in its peers' agreement round: it raises ``ValueError``,
       the others ``RemoteError``.
    2. Run the algorithm's ``_update``, whose first collective is an agreement round: it
       raises ``NonFiniteError`` on every rank, before it changes anything, when a
       gradient is NaN / Inf on some rank.
    3. On that error, ``nonfinite="skip"`` (default) leaves parameters and state as they
       were on every rank and counts the step in ``skipped_steps``, as a loss scaler
       does; ``"raise"`` lets the error through (still on every rank, nothing changed).
    4. Copy the master weights into the parameters, rounded for 16-bit ones (``FlatParams``).

    ``state_dict()`` holds this rank's whole state (moments, error-feedback buffers,
    phase counters, and this rank's own float32 parameters while the replicas differ,
    as between 0/1 Adam's synchronisations, or when 16-bit parameters hold only a
    rounding of them); save one per rank (``compcoll.checkpoint.save``) and load it on
    the same rank of a world of the same size: the run then continues bit for bit as if
    uninterrupted, whether the optimizer is built before or after the model's weights
    are loaded (building it broadcasts rank 0's parameters; ``load_state_dict`` puts
    this rank's local copy back). Rank 0's state loaded on every rank (what the Trainer,
    Accelerate and Lightning save) resumes everything but the error buffers, which
    restart at zero with a warning.

    Tuning, in this order (bytes per element sent per rank per step; a float32 ring
    allreduce sends 8(n-1)/n, and the compressed steps of the defaults 2(n-1)/(8n) plus a
    scale per rank and chunk, 1/28 to 1/32 of the ring at 2-1024 ranks,
    bench/results/scaling_bytes.txt):
    1. The warm-up (``freeze_step``, 0/1 Adam's ``var_freeze_step``; Birder has none):
       long enough for the variance to settle, typically 15-25% of the run; each warm-up
       step sends float32 (the ring's bytes), so it sets the run's bytes.
    2. ``scale`` and ``compress``: free in bytes. The defaults ("l1", "update") were
       chosen on the LM of bench/convergence; "l2" / "momentum" are DeepSpeed's numerics.
       1-bit Adam's and 0/1 Adam's ``bias_correction=True`` (free): torch.optim.Adam's bias
       correction, so a learning rate tuned for torch's Adam means the same; without it
       (DeepSpeed's) a short warm-up freezes v low and every compressed step is larger
       (docs/guides/scale.md, "Learning rates").
    3. The node layout: ``ranks_per_node="auto"`` (default) finds the nodes; on several
       the hierarchical form sends float32 inside a node and 1/k of the flat 1-bit bytes
       per rank between nodes (k ranks per node). It also loses less: the second 1-bit
       compression, what grows the flat form's gap with n, then sums the nodes' vectors,
       not the ranks' (16 ranks on 2 nodes of 8 end where 2 ranks do; docs/guides/scale.md,
       "Where the gap comes from").
    4. ``protocol``: "auto" (default) compresses once (allgather) where the 1-bit exchange
       has 2 members (2 ranks flat, 2 nodes hierarchical), for the bytes of compressing twice
       (gather-scatter), and twice from 3 on. "allgather" at m members sends (m-1)/8 bytes
       per element: 1/16 of the ring at 4 ranks, as much as the ring at 64, for small worlds.
    5. 1-bit LAMB only: ``layer_scales=True`` (one scale per layer, 4 bytes each) and
       ``variance_refresh=R`` (an exact float32 step every R steps: 8(n-1)/(nR) more per
       step).
    6. 0/1 Adam only: ``local_step_clipper=L``, the most local steps between two
       synchronisations (a local step sends nothing; a synchronisation what a compressed step
       does). Where each rank's share of the batch is small, take 1: at 64 ranks on the LM of
       bench/convergence it took 0/1 Adam from 6.7% to 0.6% above Adam.
    How each default holds from 2 to 64 ranks: docs/guides/scale.md.
    """

    _scalar_names: tuple[str, ...] = ()
    _rank_own: tuple[str, ...] = ()
    """State buffers that hold this rank's own values (from its local gradients) even while replicas agree."""
    _carried: tuple[str, ...] = ()
    """The per-parameter moments another optimizer's state carries in, named as torch's Adam and DeepSpeed's 1-bit
    optimizers name them (``carry.carry``); none: such a state does not carry over."""
    _carried_schedule: dict[str, str] = {}
    """The schedule counters DeepSpeed keeps per parameter (its key -> this optimizer's scalar) that a carried state
    sets (``carry.carry``): 0/1 Adam's intervals and counters."""
    _step_supports_amp_scaling = True

    def __init__(self, params: Params, defaults: dict[str, Any], comm: Communicator | None, nonfinite: str,
                 settings: Callable[[], dict[str, Any]] = dict) -> None:
        self._built = False
        self.comm = communicator(comm, type(self).__name__)
        what = type(self).__name__
        self.settings: dict[str, Any] = checked(self.comm, what, lambda: self._laid_out(params, defaults, nonfinite,
                                                                                        settings))
        Joinable.__init__(self)
        self.nonfinite = nonfinite
        agree(
            self.comm, what, self.flat.data, None,
            (Option("parameter layouts (groups and shapes)", self.flat.layout_code()),
             hyperparameters(self.param_groups), values_option(SETTINGS, self.settings)),
        )
        self.comm.bcast(self.flat.data, 0)
        self.flat.write_back()
        self.steps = 0
        self.skipped_steps = 0
        self._warned_scaler = False
        self._probed = False
        self._step_rounds: dict[tuple[tuple[int, ...], torch.dtype], Agreement] = {}
        self._buffers: dict[str, torch.Tensor] = {}
        self._buffer_kinds: dict[str, tuple[str, float]] = {}
        self._channel: Channel | None = None
        self._channel_args: tuple = ()
        self.workspace = Workspace()
        self._built = True

    def _laid_out(self, params: Params, defaults: dict[str, Any], nonfinite: str,
                  settings: Callable[[], dict[str, Any]]) -> dict[str, Any]:
        """Construction's local step 1: the subclass's checks, torch's own construction (the groups, ``betas`` as a
        tuple), the flat buffer; the settings every rank must hold alike (TypeError or ValueError naming a bad
        argument)."""
        if nonfinite not in NONFINITE_POLICIES:
            raise ValueError(f"{type(self).__name__}: nonfinite must be one of {NONFINITE_POLICIES}, got {nonfinite!r}")
        agreed = {**settings(), "nonfinite": nonfinite}
        super().__init__(params, {k: tuple(v) if k == "betas" else v for k, v in defaults.items()})
        self.flat = FlatParams(self.param_groups, type(self).__name__)
        return agreed

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        """Add a group of parameters to train from the next step on, as ``torch.optim.Optimizer``'s does (Lightning's
        ``BaseFinetuning.unfreeze_and_add_param_group`` calls it). Once built, a collective: every rank adds the same
        group at the same point, as every rank built the optimizer.

        1. Refuse where the algorithm could not train new parameters now
           (``_growth_refused``: 1-bit Adam and 1-bit LAMB once their variance froze, 0/1 Adam
           once no variance refresh is left in its variance phase, since a coordinate without
           variance then never moves).
        2. Follow the parameters (``_follow_parameters``), append the group (torch's checks
           and defaults) and lay the parameters out again (``FlatParams``): the new group's
           trained parameters go after the others', whose masters keep their bits. Steps 1
           and 2 are this rank's (``checked``): where they raise ValueError or TypeError, the
           other ranks raise ``RemoteError`` naming it, and nothing changed anywhere.
        3. Agree on the layout and every group's hyperparameters (``RankMismatchError`` on
           every rank otherwise, and the group is taken back), then broadcast the new
           parameters from rank 0, so replicas stay identical.
        4. Grow every state buffer: the old values where they were, the buffer's initial
           value for the new parameters (moments at zero, as torch's optimizers start a
           parameter's state at its first step). The 1-bit channel is built again for the
           longer vector, its error feedback at zero.
        """
        if not getattr(self, "_built", False):
            super().add_param_group(param_group)
            return
        name = type(self).__name__
        old, groups = self.flat, len(self.param_groups)
        try:
            flat = checked(self.comm, f"{name}.add_param_group", lambda: self._laid_out_with(param_group))
            agree(self.comm, f"{name}.add_param_group", flat.data, None,
                  (Option("parameter layouts (groups and shapes)", flat.layout_code()),), step=self._tag())
        except BaseException:
            del self.param_groups[groups:]
            raise
        flat.data[:old.numel].copy_(old.data)
        self.comm.bcast(flat.data[old.numel:], 0)
        flat.write_back()
        self.flat = flat
        for key, (per, fill) in list(self._buffer_kinds.items()):
            before = self._buffers[key]
            self._buffer(key, per, before.dtype, fill)[:before.numel()].copy_(before)
        if self._channel is not None:
            self._error_feedback(*self._channel_args)
        self.workspace = Workspace()

    def _laid_out_with(self, param_group: dict[str, Any]) -> FlatParams:
        """``add_param_group``'s local part: ValueError where the algorithm takes no new parameters now; else follow
        the parameters, append ``param_group`` (torch's checks and defaults) and lay out every group's anew."""
        name = type(self).__name__
        refused = self._growth_refused()
        if refused:
            raise ValueError(f"{name}: add_param_group at step {self.step_index}: {refused}")
        self._follow_parameters()
        super().add_param_group(param_group)
        return FlatParams(self.param_groups, name)

    def _growth_refused(self) -> str:
        """Why new parameters cannot join now (``add_param_group``), or "" where they can."""
        return ""

    def _buffer(self, name: str, per: str = "element", dtype: torch.dtype = torch.float32,
                fill: float = 0.0) -> torch.Tensor:
        """A state buffer kept in ``state_dict``, of ``fill`` (its initial value) per trained element, per trained
        parameter (``per="layer"``) or per parameter group (``per="group"``); ``add_param_group`` grows it."""
        numel = {"element": self.flat.numel, "layer": len(self.flat.segments), "group": len(self.param_groups)}[per]
        buf = torch.full((numel,), fill, dtype=dtype, device=self.flat.device)
        self._buffers[name] = buf
        self._buffer_kinds[name] = (per, fill)
        self._publish()
        return buf

    def _publish(self) -> None:
        """Show the per-parameter state as torch's optimizers do: ``self.state[p]`` maps each state buffer kept per
        parameter (``saved.per_parameter``) to p's view of it, in p's shape (a view: it reads and writes the one
        buffer). It also tells ``torch.distributed.checkpoint``'s ``get_state_dict`` that the state exists (on an
        optimizer without state it takes a step with zero gradients to make some, a step that would count here)."""
        self.state.clear()
        for p, views in parameter_views(self._buffers, self.flat, self._rank_own):
            self.state[p] = views

    @property
    def channel(self) -> Channel:
        """The 1-bit channel the algorithm sends through (``_error_feedback`` builds it)."""
        if self._channel is None:
            raise AttributeError(f"{type(self).__name__} sends through no 1-bit channel")
        return self._channel

    def _error_feedback(self, ranks_per_node: int | str | None, hierarchical: bool | None, scale: str = "l2",
                        protocol: str = "auto", by_layer: bool = False) -> Channel:
        """The 1-bit channel for the flat vector, with one scale for it or (``by_layer``) one per parameter;
        ``state_dict`` saves its error buffers (the channel owns them); ``add_param_group`` builds it again."""
        self._channel_args = (ranks_per_node, hierarchical, scale, protocol, by_layer)
        if by_layer:
            layers = [(seg.start, seg.stop) for seg in self.flat.segments]
            self._channel = LayeredChannel(self.comm, layers, ranks_per_node, hierarchical, scale, self.flat.device,
                                           protocol)
        else:
            self._channel = ErrorFeedbackChannel(self.comm, self.flat.numel, ranks_per_node, hierarchical, scale,
                                                 self.flat.device, protocol)
        return self._channel

    def _groups(self) -> Iterator[tuple[dict[str, Any], slice]]:
        """(hyperparameters, slice of the flat buffers) of every parameter group."""
        for group, (start, stop) in zip(self.param_groups, self.flat.groups):
            yield group, slice(start, stop)

    @torch.no_grad()
    @eager
    def step(self, closure: Callable[[], float] | None = None) -> float | None:
        """One optimization step on the local gradients; all communication happens here.

        Under ``torch.distributed.algorithms.join.Join([..., opt])`` it first tells the
        context this rank has not joined, and a rank that has joined steps with the others on
        a zero gradient (``join.ShadowSteps``): uneven inputs end with identical replicas.

        Returns the closure's loss, if a closure was given.
        """
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        Join.notify_join_context(self)
        self._step_on(self._local_gradient)
        return loss

    def _step_on(self, gradient: Callable[[], torch.Tensor]) -> None:
        """The step on ``gradient()`` (checked in the step's turn); a step every rank skips counts as skipped."""
        grad = checked(self.comm, f"{type(self).__name__}.step", gradient)
        try:
            self._update(grad)
        except NonFiniteError:
            self._warn_if_scaler_missed_it()
            if self.nonfinite == "raise":
                raise
            self.skipped_steps += 1
            return
        self.flat.write_back()
        self.steps += 1

    def _shadow_step(self) -> None:
        """A step on a zero gradient: this rank joined while others still step (``join.ShadowSteps``)."""
        self._step_on(self._zero_gradient)

    def _zero_gradient(self) -> torch.Tensor:
        """The flat gradient buffer, zeroed (after following the parameters, as ``_local_gradient`` does)."""
        self._follow_parameters()
        return self.flat.grad.zero_()

    def join_hook(self, **kwargs: Any) -> JoinHook:
        """The hook ``Join`` runs once this rank has joined (``join.ShadowSteps``)."""
        return ShadowSteps(self)

    @property
    def join_device(self) -> torch.device:
        """Where ``Join`` counts the ranks that have not joined (``join.join_device``)."""
        return join_device(self.comm)

    @property
    def join_process_group(self) -> Any:
        """The group ``Join`` counts on: the communicator's torch.distributed group (``join.join_process_group``)."""
        return join_process_group(self.comm, type(self).__name__)

    def _local_gradient(self) -> torch.Tensor:
        """This rank's flat gradient, unscaled when a ``torch.amp.GradScaler`` drives the step.

        ``GradScaler.step`` sets ``grad_scale`` (the loss scale, or None when
        ``scaler.unscale_(opt)`` already unscaled) and ``found_inf`` (this rank's
        overflow) on an optimizer that declares ``_step_supports_amp_scaling``:
        1. Multiply by float32(1 / grad_scale), as ``GradScaler.unscale_`` does.
        2. A found overflow makes the vector non-finite, so that the step's agreement
           round skips the step on every rank (the scaler alone would skip it on this
           rank only, and the others would wait for it in their collective).
        """
        self._follow_parameters()
        grad = self.flat.gather_grads()
        scale = getattr(self, "grad_scale", None)
        if scale is not None:
            grad.mul_(scale.double().reciprocal().float())
        found = getattr(self, "found_inf", None)
        if found is not None and bool(found.item()):
            grad[:1].fill_(float("nan"))
        return grad

    def _follow_parameters(self) -> None:
        """Re-bind the flat buffer to the parameters if a framework changed them (``FlatParams.rebind``).

        When they moved to another device, every state buffer, the channel's error buffers
        and the scratch move there too, with their values. Local: the ranks are not asked,
        since frameworks move the model on every rank alike, and a rank whose parameters
        cannot be followed refuses the step in the agreement round.
        """
        params = [p for group in self.param_groups for p in group["params"]]
        if not self.flat.rebind(params, type(self).__name__):
            return
        device = self.flat.device
        self._buffers = {name: buf.to(device) for name, buf in self._buffers.items()}
        self._publish()
        if self._channel is not None:
            self._channel.to(device)
        self.workspace = Workspace()

    def _warn_if_scaler_missed_it(self) -> None:
        """Warn (once) when another rank's overflow skipped a step this rank's GradScaler saw as clean."""
        found = getattr(self, "found_inf", None)
        if found is None or bool(found.item()) or self._warned_scaler:
            return
        self._warned_scaler = True
        warnings.warn(
            f"{type(self).__name__}: another rank's gradients overflowed and every rank skipped the step, but this "
            f"rank's torch.amp.GradScaler saw no overflow, so its loss scale will now differ from that rank's "
            f"(training stays correct and replicas identical); compcoll.optim.GradScaler agrees on overflows "
            f"across ranks and keeps the loss scales equal", stacklevel=3)

    @property
    def step_index(self) -> int:
        """The index of the step now running among every ``step`` that reached the ranks (taken or skipped alike on
        every rank): every round of a step carries it (``agreement.Agreement.check``), so ranks resumed from saves of
        different steps raise ``RankMismatchError`` on every rank at their first round, instead of running their
        schedules out of step. (A rank that skips a whole ``step()`` call counts alike and is not caught.)"""
        return self.steps + self.skipped_steps

    def _tag(self) -> Step:
        """What every round of this step carries (``agreement.Agreement.check``): ``step_index`` and the groups'
        ``hyperparameters``, read now, so that a learning rate changed on some ranks only (a scheduler stepped
        on rank 0 alone) fails on every rank, naming it, instead of training the replicas apart."""
        groups = hyperparameters(self.param_groups)
        return Step(self.step_index, groups.code, groups.name, groups.explain)

    @property
    def synchronized(self) -> bool:
        """Whether every rank holds the same parameters now (always, except between 0/1 Adam's syncs)."""
        return True

    def synchronize(self) -> None:
        """Make the replicas identical now (a collective: every rank calls it); a no-op when they are."""

    def _drop_local_steps(self) -> None:
        """Forget the steps taken since the replicas last agreed (0/1 Adam's local steps; none elsewhere)."""

    def _update(self, grad: torch.Tensor) -> None:
        """The algorithm: read ``grad`` (this rank's, flat), update ``self.flat.data`` and the state."""
        raise NotImplementedError

    def _average(self, grad: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        """The exact average of ``grad`` over ranks into ``out``; NonFiniteError (on every rank) if not finite.

        1. The step's agreement round (``_check_finite``): a rank whose gradient is not
           finite, or that refused its step, makes every rank raise before anything moves.
        2. ``exact_average``; a sum that overflowed raises NonFiniteError on every rank.
        """
        self._check_finite(grad)
        exact_average(grad, self.comm, out, self.workspace)
        if not codecs.all_finite(out):
            raise NonFiniteError(
                f"{type(self).__name__}: the averaged gradient holds NaN or Inf (a rank's gradient was not "
                f"finite); every rank skips this step alike"
            )
        return out

    def _check_finite(self, grad: torch.Tensor, values: tuple[float, ...] = ()) -> torch.Tensor:
        """One small allgather of (finite?, ``values``) at this step (``_tag``): NonFiniteError on every rank if some
        rank's grad is not finite, RankMismatchError if some rank is at another step or holds other hyperparameters.

        Without ``values``, at the first ``PROBED_STEPS`` steps on several ranks, the round
        carries a fingerprint of each rank's gradient instead (``replicated.fingerprint``):
        the same on every rank means the gradients were averaged before the step or every
        rank trains on the same batches, and a warning says so, once. Past those, a round on the
        finiteness alone reads it from the device where the transport's rounds run there (NCCL's:
        ``Agreement.check_total``, one wait), and on the host elsewhere.

        Returns the (size, len(values)) table of every rank's values.
        """
        probe = not values and not self._probed and self.comm.size > 1 and self.step_index < PROBED_STEPS
        if not values and not probe:
            rounds = kept(self._step_rounds, self.comm, f"{type(self).__name__}.step", grad.numel(), grad)
            rounds.check_total(codecs.finite_sum(grad, rounds.slot(grad.device)), step=self._tag())
            return torch.empty(self.comm.size, 0, dtype=torch.float64)
        finite = codecs.all_finite(grad)
        carried = (fingerprint(grad),) if probe else values
        table = agree(self.comm, f"{type(self).__name__}.step", grad, finite, (), carried, self._tag())
        if probe and same_everywhere(table[:, 0].tolist()):
            self._probed = True
            warnings.warn(warning(type(self).__name__, self.step_index), stacklevel=4)
        return table[:, :len(values)]

    def state_dict(self) -> dict[str, Any]:
        """This rank's state, laid out as torch's optimizers lay theirs out (``saved.torch_layout``).

        ``"state"`` holds each trained parameter's part of the state buffers (by its index in
        the groups), ``"param_groups"`` the hyperparameters; the first group's ``"compcoll"``
        entry holds the step counters, phase scalars, the other buffers and, under
        ``"rank{r}"``, this rank's own: its error feedback and, while the replicas differ
        (``synchronized`` False), its parameters (building an optimizer broadcasts rank 0's
        over them). The float32 master weights of a model with 16-bit parameters are always
        in. ``torch.distributed.checkpoint`` saves it by the parameters' names (tested).
        """
        self._follow_parameters()
        groups = []
        index = 0
        for group in self.param_groups:
            saved = {k: v for k, v in group.items() if k != "params"}
            saved["params"] = list(range(index, index + len(group["params"])))
            index += len(group["params"])
            groups.append(saved)
        inner = {
            "algorithm": type(self).__name__,
            "world_size": self.comm.size,
            "rank": self.comm.rank,
            "layout": self.flat.layout_code(),
            "steps": self.steps,
            "skipped_steps": self.skipped_steps,
            "scalars": {name: getattr(self, name) for name in self._scalar_names},
            "buffers": self._buffers,
            "error_feedback": None if self._channel is None else self._channel.state_dict(),
            "params": None if self.synchronized and not self.flat.low_precision else self.flat.data.clone(),
        }
        return torch_layout(inner, groups, self.flat, self._rank_own, self.synchronized)

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore what ``state_dict()`` saved: this rank's own, or another rank's (frameworks save rank 0's).

        1. Check the algorithm, parameter groups, shapes and buffers (ValueError naming
           what differs; nothing changes).
        2. Load the step counters, phase scalars, hyperparameters, moments and any saved
           parameters: the same on every rank while the replicas agree, so any rank's do.
        3. The error-feedback buffers belong to one rank's share of the vector and one
           world size: this rank's own are loaded, so the run continues bit for bit;
           from another rank or world size they restart at zero, and buffers that are a
           rank's own (``_rank_own``: Birder's local moments) are the saving rank's, with a
           warning that exact resume needs each rank's own state (``compcoll.checkpoint``).
           All ranks that load the same state continue with identical replicas.
        """
        name = type(self).__name__
        self._follow_parameters()
        state = inner_state(state_dict, self.flat, self.comm.rank, self.comm.size, name)
        if state.get("algorithm") != name:
            raise ValueError(f"{name}: this checkpoint is a {state.get('algorithm')!r} optimizer's state")
        own = (state["world_size"], state["rank"]) == (self.comm.size, self.comm.rank)
        if state["layout"] != self.flat.layout_code() or len(state_dict["param_groups"]) != len(self.param_groups):
            raise ValueError(f"{name}: checkpoint is for other parameter groups or shapes than this optimizer's")
        missing = set(self._buffers) ^ set(state["buffers"])
        if missing:
            raise ValueError(f"{name}: checkpoint buffers differ from this optimizer's: {sorted(missing)}")
        for key, saved in state["buffers"].items():
            if saved.shape != self._buffers[key].shape:
                raise ValueError(f"{name}: checkpoint buffer {key!r} has shape {tuple(saved.shape)}")
        if (state.get("error_feedback") is None) != (self._channel is None):
            raise ValueError(f"{name}: checkpoint error-feedback buffers differ from this optimizer's")
        local = state.get("params")
        if local is not None and local.shape != self.flat.data.shape:
            raise ValueError(f"{name}: checkpoint parameters have shape {tuple(local.shape)}")
        if self._channel is not None and own:
            self._channel.load_state_dict(state["error_feedback"])
        elif self._channel is not None:
            self._channel.reset()
        if not own and (self._channel is not None or self._rank_own):
            lost = ["the error-feedback buffers restart at zero"] if self._channel is not None else []
            lost += [f"{', '.join(self._rank_own)} are that rank's"] if self._rank_own else []
            warnings.warn(foreign_state(name, state, self.comm.rank, self.comm.size, " and ".join(lost)), stacklevel=2)
        for key, saved in state["buffers"].items():
            self._buffers[key].copy_(saved)
        if local is not None:
            self.flat.data.copy_(local)
            self.flat.write_back()
        for key, value in state["scalars"].items():
            setattr(self, key, value)
        self.steps = state["steps"]
        self.skipped_steps = state["skipped_steps"]
        for group, saved in zip(self.param_groups, state_dict["param_groups"]):
            group.update({k: v for k, v in saved.items() if k not in ("params", SECTION)})
