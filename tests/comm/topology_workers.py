"""Rank-side bodies of the topology tests (run by compcoll.launcher)."""

from __future__ import annotations

import torch

import compcoll
from compcoll.comm.topology import NODES, TOPOLOGIES, node_size, topology


def layout(comm: compcoll.Communicator, ranks_per_node: int | None) -> None:
    """Nodes, local ranks and sub-communicators match node = rank // k; the layout is reused."""
    n, rank = comm.size, comm.rank
    topo = topology(comm, ranks_per_node)
    k = ranks_per_node or n
    assert (topo.ranks_per_node, topo.nodes) == (k, n // k)
    assert (topo.node, topo.local_rank) == (rank // k, rank % k)
    assert topo.node_of == tuple(r // k for r in range(n))
    assert topo.intra_ranks == tuple(topo.node * k + j for j in range(k))
    assert topo.inter_ranks == tuple(m * k + topo.local_rank for m in range(n // k))
    mine = torch.tensor([rank], dtype=torch.int64)
    peers = torch.empty(k, dtype=torch.int64)
    topo.intra.allgather(mine, peers)
    assert peers.tolist() == [topo.node * k + j for j in range(k)], peers
    others = torch.empty(n // k, dtype=torch.int64)
    topo.inter.allgather(mine, others)
    assert others.tolist() == [m * k + topo.local_rank for m in range(n // k)], others
    assert topology(comm, ranks_per_node) is topo, "the layout was built again"

    before = comm.bytes_sent
    intra0, inter0 = topo.traffic(comm)
    comm.allgather(torch.zeros(3, dtype=torch.float64), torch.empty(3 * n, dtype=torch.float64))
    intra1, inter1 = topo.traffic(comm)
    assert (intra1 - intra0, inter1 - inter0) == ((k - 1) * 24, (n - k) * 24)
    topo.inter.alltoall(torch.zeros(4 * topo.nodes), torch.empty(4 * topo.nodes))
    intra2, inter2 = topo.traffic(comm)
    assert (intra2 - intra1, inter2 - inter1) == (0, (topo.nodes - 1) * 16)
    assert intra2 + inter2 - intra0 - inter0 == comm.bytes_sent - before


def refused(comm: compcoll.Communicator, per_rank: list[int], expected: str) -> None:
    """Every rank raises the same error for a layout that cannot work; none hangs."""
    try:
        topology(comm, per_rank[comm.rank])
    except (ValueError, compcoll.RankMismatchError) as exc:
        assert expected in str(exc), str(exc)
    else:
        raise AssertionError("an impossible layout was accepted")
    comm.barrier()


def sizes(comm: compcoll.Communicator, requested: int | str | None, expected: int) -> None:
    """``node_size``: the ranks per node of the hierarchical form, or 1 for the flat one, alike on every rank; the
    nodes are discovered once (a layout that cannot be, ``LayoutError``, each time), and no sub-communicator is
    made (a flat job would never use its groups)."""
    assert node_size(comm, requested) == expected
    before = comm.bytes_sent
    assert node_size(comm, requested) == expected
    assert (comm.bytes_sent == before) == bool(comm.attached[NODES]), "the nodes were discovered again"
    assert TOPOLOGIES not in comm.attached, "node_size made the intra- and inter-node sub-communicators"
