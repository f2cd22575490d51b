"""The error-compensated 1-bit allreduce an optimizer sends through: flat, or hierarchical across nodes; owns its error buffers."""

from __future__ import annotations

import torch

from ..algorithms.hierarchical import hierarchical_compressed_allreduce, hierarchical_error_numels
from ..algorithms.onebit import compressed_allreduce
from ..comm import Communicator
from ..comm.topology import topology
from ..errors import RankMismatchError
from ..spec import padded_numel


class ErrorFeedbackChannel:
    """``compressed_allreduce`` over a fixed-length vector, with its own worker and server errors.

    1. Choose the algorithm once: ``hierarchical=None`` takes the hierarchical form
       (float32 inside a node, 1-bit gather-scatter between nodes) when the ranks form
       several equal nodes of more than one rank each, else the flat gather-scatter;
       True / False force it.
    2. Size the error buffers for that algorithm and remember which elements of the
       padded vector each buffer covers, so that ``forget`` can clear coordinates.

    Args:
        comm: the communicator.
        numel: the length of every vector sent.
        ranks_per_node: as for ``hierarchical_compressed_allreduce``.
        hierarchical: None (auto), True or False.
    """

    def __init__(
        self, comm: Communicator, numel: int, ranks_per_node: int | None = None, hierarchical: bool | None = None
    ) -> None:
        self.comm = comm
        self.numel = numel
        self.ranks_per_node = ranks_per_node
        self.hierarchical = _use_hierarchical(comm, ranks_per_node) if hierarchical is None else bool(hierarchical)
        n = comm.size
        full = padded_numel(numel, n)
        if self.hierarchical:
            layout = topology(comm, ranks_per_node)
            worker, server = hierarchical_error_numels(numel, n, layout.ranks_per_node)
            worker_start = layout.local_rank * worker
            server_start = worker_start + layout.inter.rank * server
        else:
            worker, server = full, full // n
            worker_start, server_start = 0, comm.rank * server
        self.worker_error = torch.zeros(worker, dtype=torch.float32)
        self.server_error = torch.zeros(server, dtype=torch.float32)
        self._spans = ((self.worker_error, worker_start), (self.server_error, server_start))

    def __call__(self, tensor: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        """The 1-bit estimate of the average of ``tensor`` over ranks, written to ``out``.

        Raises NonFiniteError on every rank (nothing changed) when some rank's input is not finite.
        """
        if self.hierarchical:
            return hierarchical_compressed_allreduce(
                tensor, self.worker_error, self.server_error, self.comm, ranks_per_node=self.ranks_per_node, out=out
            )
        return compressed_allreduce(tensor, self.worker_error, self.server_error, self.comm, out=out)

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
        for buffer, start in self._spans:
            overlap = max(0, min(buffer.numel(), self.numel - start))
            if overlap:
                buffer[:overlap].masked_fill_(coordinates[start:start + overlap], 0.0)

    def reset(self) -> None:
        """Zero both error buffers (when what they compensate changes meaning)."""
        self.worker_error.zero_()
        self.server_error.zero_()


def _use_hierarchical(comm: Communicator, ranks_per_node: int | None) -> bool:
    """Whether the ranks form several equal nodes of more than one rank (every rank decides alike).

    Nodes of different sizes mean the flat form; ranks that disagree on the layout
    (``RankMismatchError``) are an error, raised on every rank.
    """
    try:
        layout = topology(comm, ranks_per_node)
    except RankMismatchError:
        raise
    except ValueError:
        return False
    return layout.nodes > 1 and layout.ranks_per_node > 1
