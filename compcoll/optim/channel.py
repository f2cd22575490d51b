"""The error-compensated 1-bit allreduce an optimizer sends through: a flat or hierarchical plan that owns its error buffers."""

from __future__ import annotations

from typing import Any

import torch

from ..algorithms.hierarchical import CompensatedPlan, hierarchical_error_numels
from ..algorithms.inputs import check_protocol
from ..algorithms.onebit import FlatPlan
from ..algorithms.plan import ErrorFeedback
from ..comm import Communicator
from ..comm.topology import LayoutError, requested_ranks_per_node, topology


class ErrorFeedbackChannel:
    """1-bit averages of a fixed-length vector through one plan, whose error buffers it keeps.

    1. Choose the algorithm once: ``hierarchical=None`` takes the hierarchical form
       (float32 inside a node, 1-bit gather-scatter between nodes) when the ranks form
       several equal nodes of more than one rank each, else the flat form (``protocol``);
       True / False force it.
    2. Build its plan; the plan's ``ErrorFeedback`` holds the worker and server errors and
       knows which elements of the vector each covers, so that ``forget`` can clear them.

    Args:
        comm: the communicator.
        numel: the length of every vector sent.
        ranks_per_node: as for ``hierarchical_compressed_allreduce``.
        hierarchical: None (auto), True or False.
        scale: the 1-bit scale, "l2" or "l1" (``compressed_allreduce``'s ``scale``).
        device: where the vectors and the error buffers live (the optimizer's parameters' device).
        protocol: the flat form's protocol, "gather_scatter" or "allgather" (``compressed_allreduce``'s);
            "allgather" compresses once and sends (n - 1) / 2 times the bytes per rank, so it has no
            hierarchical form: with several nodes pass ``hierarchical=False``.

    Raises:
        ValueError: ``protocol`` is unknown, or "allgather" where the hierarchical form is chosen
            (alike on every rank: the choice is the same everywhere).
    """

    def __init__(
        self, comm: Communicator, numel: int, ranks_per_node: int | None = None, hierarchical: bool | None = None,
        scale: str = "l2", device: torch.device | str = "cpu", protocol: str = "gather_scatter",
    ) -> None:
        check_protocol("ErrorFeedbackChannel", protocol)
        self.comm = comm
        self.numel = numel
        self.hierarchical = _use_hierarchical(comm, ranks_per_node) if hierarchical is None else bool(hierarchical)
        if self.hierarchical and protocol != "gather_scatter":
            raise ValueError(f"ErrorFeedbackChannel: the {protocol} protocol has no hierarchical form; these ranks "
                             f"form several nodes, so pass hierarchical=False to use it between all ranks")
        device = torch.device(device)
        self.plan: FlatPlan | CompensatedPlan
        if self.hierarchical:
            k = topology(comm, ranks_per_node).ranks_per_node
            self.plan = CompensatedPlan(comm, numel, device, requested_ranks_per_node(ranks_per_node),
                                        ranks_per_node, hierarchical_error_numels(numel, comm.size, k), scale)
        else:
            self.plan = FlatPlan(comm, numel, device, protocol, None, scale)

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

    def __call__(self, tensor: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        """The 1-bit estimate of the average of ``tensor`` over ranks, written to ``out``.

        Raises NonFiniteError on every rank (nothing changed) when some rank's input is not finite.
        """
        return self.plan.start(tensor, out, False)

    def average_except(self, tensor: torch.Tensor, out: torch.Tensor, silent: torch.Tensor) -> torch.Tensor:
        """``self(tensor, out)``, then zero where ``silent`` in ``out`` and in both error buffers.

        A 1-bit sign has no zero: without this, coordinates that should not move would get
        +-scale every step and carry it in their error feedback.
        """
        self(tensor, out)
        out.masked_fill_(silent, 0.0)
        self.forget(silent)
        return out

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


def _use_hierarchical(comm: Communicator, ranks_per_node: int | None) -> bool:
    """Whether the ranks form several equal nodes of more than one rank (every rank decides alike).

    Ranks that cannot form equal nodes (``LayoutError``) mean the flat form; ranks that
    disagree on the layout (``RankMismatchError``) or a rank whose ranks per node is not a
    positive integer (ValueError) are errors, raised on every rank.
    """
    try:
        layout = topology(comm, ranks_per_node)
    except LayoutError:
        return False
    return layout.nodes > 1 and layout.ranks_per_node > 1
