"""Rank-side bodies of the channel tests: ranks that disagree on, or cannot form, a node layout."""

from __future__ import annotations

import os

import compcoll
from compcoll.comm.topology import RANKS_PER_NODE_ENV
from compcoll.optim.channel import ErrorFeedbackChannel


def layout_disagreement(comm: compcoll.Communicator) -> None:
    """Ranks asking for different ranks_per_node raise RankMismatchError on every rank (no silent flat fallback)."""
    try:
        ErrorFeedbackChannel(comm, 1000, ranks_per_node=1 + comm.rank % 2)
    except compcoll.RankMismatchError as exc:
        assert "ranks_per_node" in str(exc), exc
    else:
        raise AssertionError("ranks that disagree on the layout built a channel")


def bad_request_on_one_rank(comm: compcoll.Communicator) -> None:
    """COMPCOLL_RANKS_PER_NODE not a positive integer on the last rank: ValueError on every rank, naming it."""
    last = comm.size - 1
    os.environ[RANKS_PER_NODE_ENV] = "two" if comm.rank == last else "1"
    try:
        ErrorFeedbackChannel(comm, 1000)
    except ValueError as exc:
        assert f"not a positive integer on rank(s) [{last}]" in str(exc), exc
        assert ("this rank: " in str(exc)) == (comm.rank == last), exc
    else:
        raise AssertionError("a bad COMPCOLL_RANKS_PER_NODE built a channel")
    finally:
        del os.environ[RANKS_PER_NODE_ENV]
    comm.barrier()


def uneven_nodes_go_flat(comm: compcoll.Communicator) -> None:
    """ranks_per_node that does not divide the world: the flat form on every rank, and the channel works."""
    channel = ErrorFeedbackChannel(comm, 1000, ranks_per_node=2)
    assert not channel.hierarchical
    comm.barrier()


def allgather_needs_flat(comm: compcoll.Communicator) -> None:
    """The allgather protocol where the ranks form several nodes: ValueError on every rank, unless forced flat."""
    try:
        ErrorFeedbackChannel(comm, 1000, ranks_per_node=2, protocol="allgather")
    except ValueError as exc:
        assert "hierarchical=False" in str(exc), exc
    else:
        raise AssertionError("the allgather protocol built a hierarchical channel")
    channel = ErrorFeedbackChannel(comm, 1000, ranks_per_node=2, hierarchical=False, protocol="allgather")
    assert channel.plan.protocol == "allgather"
    comm.barrier()
