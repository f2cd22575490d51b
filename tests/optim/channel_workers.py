"""Rank-side bodies of the channel tests: ranks that disagree on, or cannot form, a node layout."""

from __future__ import annotations

import os

import torch

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


def protocol_choice(comm: compcoll.Communicator) -> None:
    """What each protocol stands for, flat and on nodes of 2 and of n / 2 ranks ("auto": allgather between 2
    members, else gather-scatter), each channel averaging as its plan's function does; an unknown protocol raises
    ValueError naming the choices."""
    n, rank = comm.size, comm.rank
    cases = [(n // 2, None, "auto", "allgather"), (2, None, "auto", "allgather" if n == 4 else "gather_scatter"),
             (2, False, "auto", "gather_scatter"), (2, None, "gather_scatter", "gather_scatter"),
             (2, None, "allgather", "allgather")]
    x = torch.randn(1001, generator=torch.Generator().manual_seed(rank))
    for k, hierarchical, protocol, chosen in cases:
        channel = ErrorFeedbackChannel(comm, x.numel(), ranks_per_node=k, hierarchical=hierarchical, protocol=protocol)
        assert (channel.hierarchical, channel.protocol) == (hierarchical is None, chosen), (k, protocol)
        assert channel.plan.protocol == chosen
        got = channel(x, torch.empty_like(x))
        we, se = (torch.zeros_like(e) for e in (channel.worker_error, channel.server_error))
        if channel.hierarchical:
            want = compcoll.hierarchical_compressed_allreduce(x, we, se, comm, ranks_per_node=k, protocol=chosen)
        else:
            want = compcoll.compressed_allreduce(x, we, se, comm, protocol=chosen)
        assert torch.equal(got, want), (k, protocol)
    try:
        ErrorFeedbackChannel(comm, 1000, protocol="ring")
    except ValueError as exc:
        assert "protocol 'ring' is not one of ('gather_scatter', 'allgather', 'auto')" in str(exc), exc
    else:
        raise AssertionError("an unknown protocol built a channel")
    comm.barrier()
