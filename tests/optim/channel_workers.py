"""Rank-side body of the channel test: ranks that disagree on the node layout fail alike."""

from __future__ import annotations

import compcoll
from compcoll.optim.channel import ErrorFeedbackChannel


def layout_disagreement(comm: compcoll.Communicator) -> None:
    """Ranks asking for different ranks_per_node raise RankMismatchError on every rank (no silent flat fallback)."""
    try:
        ErrorFeedbackChannel(comm, 1000, ranks_per_node=1 + comm.rank % 2)
    except compcoll.RankMismatchError as exc:
        assert "ranks_per_node" in str(exc), exc
    else:
        raise AssertionError("ranks that disagree on the layout built a channel")
