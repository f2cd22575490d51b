"""The 1-bit allreduce an optimizer sends through: plans that own its error buffers, one or one per layer."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, Sequence

import torch

from .. import codecs
from ..algorithms.agreement import Agreement, Step
from ..algorithms.hierarchical import CompensatedPlan, hierarchical_error_numels
from ..algorithms.inputs import check_protocol
from ..algorithms.onebit import FlatPlan
from ..algorithms.plan import ErrorFeedback
from ..comm import Communicator
from ..comm.topology import node_size, requested_ranks_per_node, topology
from ..spec import CHANNEL_PROTOCOLS, protocol_for


class Channel(ABC):
    """What the optimizers send through: ``self(tensor, out)`` gives the 1-bit average, ``forget`` clears errors."""

    @abstractmethod
    def __call__(self, tensor: torch.Tensor, out: torch.Tensor, step: Step | None = None) -> torch.Tensor:
        """The 1-bit estimate of the average of ``tensor`` over ranks, written to ``out``; ``step``, where given, is
        the caller's step (its count and settings), which every rank must hold alike (``Agreement.check``)."""

    @abstractmethod
    def forget(self, coordinates: torch.Tensor) -> None:
        """Zero the error buffers at the coordinates where the bool vector ``coordinates`` is True."""

    @abstractmethod
    def reset(self) -> None:
        """Zero the error buffers (when what they compensate changes meaning)."""

    @abstractmethod
    def state_dict(self) -> dict[str, Any]:
        """This rank's error buffers."""

    @abstractmethod
    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Copy back what ``state_dict()`` saved on this rank."""

    @abstractmethod
    def to(self, device: torch.device) -> None:
        """Take vectors on ``device`` from now on; the error buffers move there (local, values kept)."""

    def average_except(self, tensor: torch.Tensor, out: torch.Tensor, silent: torch.Tensor | None,
                       step: Step | None = None) -> torch.Tensor:
        """``self(tensor, out, step)``, then zero where ``silent`` in ``out`` and in both error buffers (None: no
        coordinate is silent, ``silent.silent_coordinates``).

        A 1-bit sign has no zero: without this, coordinates that should not move would get
        +-scale every step and carry it in their error feedback.
        """
        self(tensor, out, step)
        if silent is not None:
            out.masked_fill_(silent, 0.0)
            self.forget(silent)
        return out


class ErrorFeedbackChannel(Channel):
    """1-bit averages of a fixed-length vector through one plan, whose error buffers it keeps.

    1. Choose the algorithm once: ``hierarchical=None`` takes the hierarchical form
       (float32 inside a node, 1-bit ``protocol`` between nodes) when the ranks form
       several equal nodes of more than one rank each, else the flat form (``protocol``
       between all ranks); True / False force it.
    2. Build its plan; the plan's ``ErrorFeedback`` holds the worker and server errors and
       knows which elements of the vector each covers, so that ``forget`` can clear them.

    Args:
        comm: the communicator.
        numel: the length of every vector sent.
        ranks_per_node: as for ``hierarchical_compressed_allreduce``.
        hierarchical: None (auto), True or False.
        scale: the 1-bit scale, "l2" or "l1" (``compressed_allreduce``'s ``scale``).
        device: where the vectors and the error buffers live (the optimizer's parameters' device).
        protocol: the 1-bit protocol between the m ranks (flat) or nodes (hierarchical): "gather_scatter"
            (``compressed_allreduce``'s two compressions), "allgather" (one compression; m / 2 times the
            bytes per rank, the same at m = 2) or "auto" (default: "allgather" at m = 2, else "gather_scatter";
            ``spec.protocol_for``). ``protocol`` holds the one chosen.

    Raises:
        ValueError: ``protocol`` is unknown (alike on every rank).
    """

    def __init__(
        self, comm: Communicator, numel: int, ranks_per_node: int | str | None = "auto",
        hierarchical: bool | None = None,
        scale: str = "l2", device: torch.device | str = "cpu", protocol: str = "auto",
    ) -> None:
        check_protocol("ErrorFeedbackChannel", protocol, CHANNEL_PROTOCOLS)
        self.comm = comm
        self.numel = numel
        self.hierarchical = node_size(comm, ranks_per_node) > 1 if hierarchical is None else bool(hierarchical)
        device = torch.device(device)
        self.plan: FlatPlan | CompensatedPlan
        if self.hierarchical:
            layout = topology(comm, ranks_per_node)
            self.protocol = protocol_for(protocol, layout.nodes)
            self.plan = CompensatedPlan(comm, numel, device, requested_ranks_per_node(ranks_per_node), ranks_per_node,
                                        hierarchical_error_numels(numel, comm.size, layout.ranks_per_node), scale,
                                        protocol=self.protocol)
        else:
            self.protocol = protocol_for(protocol, comm.size)
            self.plan = FlatPlan(comm, numel, device, self.protocol, None, scale)

    @property
    def error_feedback(self) -> ErrorFeedback:
        """The plan's error buffers (the one owner of this channel's error-feedback state)."""
        return self.plan.error_feedback

    @property
    def worker_error(self) -> torch.Tensor:
        return self.error_feedback.worker_error

    @property
    def server_error(self) -> torch.Tensor:
        return self.error_feedback.server_error

    def __call__(self, tensor: torch.Tensor, out: torch.Tensor, step: Step | None = None) -> torch.Tensor:
        """The 1-bit estimate of the average of ``tensor`` over ranks, written to ``out``.

        Raises NonFiniteError on every rank (nothing changed) when some rank's input is not finite, and
        RankMismatchError on every rank when ranks pass another ``step``.
        """
        return self.plan.start(tensor, out, False, step=step)

    def forget(self, coordinates: torch.Tensor) -> None:
        """Zero both error buffers at the coordinates where the bool vector ``coordinates`` is True."""
        self.error_feedback.forget(coordinates)

    def reset(self) -> None:
        """Zero both error buffers (when what they compensate changes meaning)."""
        self.error_feedback.reset()

    def state_dict(self) -> dict[str, Any]:
        """The error buffers (``ErrorFeedback.state_dict``)."""
        return self.error_feedback.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.error_feedback.load_state_dict(state)

    def to(self, device: torch.device) -> None:
        self.plan.to(device)


class LayeredChannel(Channel):
    """1-bit averages of a fixed-length vector with one scale per layer: an ``ErrorFeedbackChannel`` per layer.

    Under one scale, a layer whose update is small against the rest of the vector gets
    signs of the whole vector's scale; with its own, its 1-bit estimate keeps its size (on
    the LM of ``bench/convergence``, 1-bit LAMB with the allgather protocol and variance
    refreshes went from +1.7 / +1.2 / +3.4% of LAMB's validation loss at three batch orders
    to +1.9 / +0.0 / +1.0%; docs/guides/optimizers.md). Per call:
    1. One agreement on the whole vector (signature, finiteness and the caller's step): a NaN or Inf on some
       rank raises ``NonFiniteError`` on every rank before any layer's buffers change.
    2. Each layer's slice through its own channel, in layer order, so every rank pairs the
       same calls; each layer's plan keeps its own error buffers and scale.

    Args:
        comm: the communicator.
        layers: (start, stop) of each layer in the vector, in order, covering it; empty
            layers are skipped.
        ranks_per_node, hierarchical, scale, device, protocol: as for ``ErrorFeedbackChannel``;
            the first layer's channel decides flat or hierarchical for all.
    """

    what = "1-bit average by layer"

    def __init__(
        self, comm: Communicator, layers: Sequence[tuple[int, int]], ranks_per_node: int | str | None = "auto",
        hierarchical: bool | None = None, scale: str = "l2", device: torch.device | str = "cpu",
        protocol: str = "auto",
    ) -> None:
        self.layers = [(start, stop) for start, stop in layers if stop > start]
        if not self.layers:
            raise ValueError("LayeredChannel: needs at least one non-empty layer")
        self.numel = self.layers[-1][1]
        self.channels: list[ErrorFeedbackChannel] = []
        for start, stop in self.layers:
            channel = ErrorFeedbackChannel(comm, stop - start, ranks_per_node, hierarchical, scale, device, protocol)
            hierarchical = channel.hierarchical
            self.channels.append(channel)
        self.agreement = Agreement(comm, self.what, self.numel, (self.numel,), torch.float32)

    def __call__(self, tensor: torch.Tensor, out: torch.Tensor, step: Step | None = None) -> torch.Tensor:
        """Steps 1-2: the 1-bit estimate of the average of ``tensor`` over ranks, layer by layer, into ``out``
        (step 1's agreement checks ``step``)."""
        self.agreement.check_total(codecs.finite_sum(tensor, self.agreement.slot(tensor.device)), step=step)
        for (start, stop), channel in zip(self.layers, self.channels):
            channel(tensor[start:stop], out[start:stop])
        return out

    def forget(self, coordinates: torch.Tensor) -> None:
        """Zero every layer's error buffers at the coordinates where the bool vector ``coordinates`` is True."""
        for (start, stop), channel in zip(self.layers, self.channels):
            channel.forget(coordinates[start:stop])

    def reset(self) -> None:
        """Zero every layer's error buffers."""
        for channel in self.channels:
            channel.reset()

    def state_dict(self) -> dict[str, Any]:
        """Every layer's error buffers, in layer order."""
        return {"layers": [channel.state_dict() for channel in self.channels]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        saved = state.get("layers")
        if saved is None or len(saved) != len(self.channels):
            raise ValueError(f"LayeredChannel: the checkpoint's error buffers are not for these "
                             f"{len(self.channels)} layers")
        for channel, layer in zip(self.channels, saved):
            channel.load_state_dict(layer)

    def to(self, device: torch.device) -> None:
        for channel in self.channels:
            channel.to(device)
