"""Which ranks share a node: the nodes, and the intra- and inter-node sub-communicators, built once per communicator."""

from __future__ import annotations

import hashlib
import os
import socket
from dataclasses import dataclass

import torch

from ..errors import RankMismatchError
from .base import Communicator

RANKS_PER_NODE_ENV = "COMPCOLL_RANKS_PER_NODE"
AUTO = "auto"
"""``ranks_per_node="auto"`` (the default everywhere; None means the same): ``COMPCOLL_RANKS_PER_NODE`` if set, else
the hostnames."""
BAD_REQUEST = -1
"""What a rank whose ranks_per_node (or ``COMPCOLL_RANKS_PER_NODE``) is not a positive integer sends the others."""


class LayoutError(ValueError):
    """The ranks cannot form nodes of equal size (raised alike on every rank)."""


TOPOLOGIES = "topologies"
"""The name of a communicator's topologies in its ``attached``: a dict of requested layout to Topology."""
NODES = "nodes"
"""The name of a communicator's discovered nodes in its ``attached``: a dict of requested layout to ``node_of``."""


@dataclass(frozen=True)
class Topology:
    """How the ranks of a communicator sit on nodes.

    Every node holds ``ranks_per_node`` ranks. ``intra`` joins this rank with the others
    on its node (its rank there is ``local_rank``); ``inter`` joins it with the ranks of
    the same local rank on the other nodes, one per node. Both order their members by
    rank in the parent communicator. ``node_of[r]`` is the node of rank r, nodes being
    numbered in the order of their first ranks; ``intra_ranks`` and ``inter_ranks`` are
    the members of ``intra`` and ``inter`` as ranks of the parent.
    """

    ranks_per_node: int
    nodes: int
    node: int
    local_rank: int
    node_of: tuple[int, ...]
    intra_ranks: tuple[int, ...]
    inter_ranks: tuple[int, ...]
    intra: Communicator
    inter: Communicator

    def traffic(self, comm: Communicator) -> tuple[int, int]:
        """Bytes ``comm`` (the communicator this topology describes) has sent (intra-node, inter-node).

        Reads ``comm.bytes_sent_to``, which also holds the bytes of its sub-communicators.
        """
        if len(comm.bytes_sent_to) != len(self.node_of):
            raise ValueError(f"this topology describes {len(self.node_of)} ranks, the communicator has {comm.size}")
        mine = self.node_of[comm.rank]
        intra = sum(b for r, b in enumerate(comm.bytes_sent_to) if self.node_of[r] == mine)
        return intra, comm.bytes_sent - intra


def topology(comm: Communicator, ranks_per_node: int | str | None = AUTO) -> Topology:
    """The node layout of ``comm`` with its sub-communicators, built once and then reused (collectives on first use).

    1. The nodes: ``node_of(comm, ranks_per_node)`` (an allgather on first use).
    2. A topology already built for that request is returned.
    3. Split ``comm`` into the intra-node and inter-node communicators.

    Every rank must call it with the same ``ranks_per_node``; errors are ``node_of``'s, raised on
    every rank alike.
    """
    nodes = node_of(comm, ranks_per_node)
    built = comm.attached.setdefault(TOPOLOGIES, {})
    requested = request_code(ranks_per_node)
    if requested in built:
        return built[requested]
    node = nodes[comm.rank]
    seen: dict[int, int] = {}
    local_of = []
    for r in range(comm.size):
        local_of.append(seen.get(nodes[r], 0))
        seen[nodes[r]] = local_of[-1] + 1
    local_rank = local_of[comm.rank]
    intra = comm.split(node)
    inter = comm.split(local_rank)
    layout = Topology(
        ranks_per_node=intra.size,
        nodes=inter.size,
        node=node,
        local_rank=local_rank,
        node_of=nodes,
        intra_ranks=tuple(r for r in range(comm.size) if nodes[r] == node),
        inter_ranks=tuple(r for r in range(comm.size) if local_of[r] == local_rank),
        intra=intra,
        inter=inter,
    )
    built[requested] = layout
    return layout


def node_of(comm: Communicator, ranks_per_node: int | str | None = AUTO) -> tuple[int, ...]:
    """The node of every rank of ``comm``, discovered once per request and then reused (a collective on first use).

    1. The requested layout is ``ranks_per_node`` if it is a number, else (``"auto"`` or
       None) ``COMPCOLL_RANKS_PER_NODE`` if set, else "discover". Nodes already found for
       that request are returned.
    2. Allgather (hash of the hostname, requested ranks_per_node) over ``comm``; every
       rank checks that all ranks asked for the same thing.
    3. With ranks_per_node = k, consecutive ranks share a node (node = rank // k, as
       launchers place them); ``comm.size`` must be a multiple of k. Otherwise ranks with
       the same hostname share a node, nodes numbered by their first rank, and every node
       must hold the same number of ranks.
    No sub-communicator is made: ``node_size`` decides the flat form from this alone.

    Every rank must call it with the same ``ranks_per_node``. Errors are raised on every
    rank alike, so none is left waiting: a rank whose request is not a positive integer
    still takes its part in the allgather (``request_code``).

    Raises:
        ValueError: ranks_per_node or ``COMPCOLL_RANKS_PER_NODE`` is not a positive
            integer on some rank (``check_requests``).
        LayoutError: ranks_per_node does not divide the world, or nodes hold different
            numbers of ranks (pass ``ranks_per_node`` or use the flat algorithm).
        RankMismatchError: ranks asked for different ranks_per_node.
    """
    requested = request_code(ranks_per_node)
    found = comm.attached.setdefault(NODES, {})
    if requested in found:
        return found[requested]
    mine = torch.tensor([host_id(), requested], dtype=torch.int64)
    table = torch.empty(2 * comm.size, dtype=torch.int64)
    comm.allgather(mine, table)
    hosts, asked = table.view(comm.size, 2).t().tolist()
    check_requests(asked, "topology", ranks_per_node)
    if len(set(asked)) > 1:
        listed = ", ".join(f"rank {r}: {k or 'discover'}" for r, k in enumerate(asked))
        raise RankMismatchError(f"topology: ranks asked for different ranks_per_node ({listed})")
    found[requested] = tuple(_layout(hosts, requested))
    return found[requested]


def requested_ranks_per_node(ranks_per_node: int | str | None) -> int:
    """The ranks per node asked for: the argument if a number, else ``COMPCOLL_RANKS_PER_NODE``; 0: discover."""
    if ranks_per_node is None or ranks_per_node == AUTO:
        value = os.environ.get(RANKS_PER_NODE_ENV, "")
        if not value:
            return 0
        if not value.isdigit():
            raise ValueError(f"{RANKS_PER_NODE_ENV}={value!r} is not a positive integer")
        ranks_per_node = int(value)
    if isinstance(ranks_per_node, bool) or not isinstance(ranks_per_node, int) or ranks_per_node < 1:
        raise ValueError(f"ranks_per_node must be a positive integer or \"auto\", got {ranks_per_node!r}")
    return ranks_per_node


def node_size(comm: Communicator, ranks_per_node: int | str | None = AUTO) -> int:
    """The ranks per node of the hierarchical form for ``comm``, or 1 for the flat form (every rank decides alike).

    1. ``node_of(comm, ranks_per_node)``: the nodes asked for, or the hostnames' (no
       sub-communicator is made: a flat job never builds the groups it would not use).
    2. k when the ranks form several equal nodes of k > 1 ranks each; 1 (flat) when there
       is one node, one rank per node, or nodes of unequal sizes (``LayoutError``).
    Ranks that disagree on the request (``RankMismatchError``), or a request that is not a
    positive integer or "auto" (ValueError), raise on every rank.
    """
    try:
        nodes = node_of(comm, ranks_per_node)
    except LayoutError:
        return 1
    count = len(set(nodes))
    return len(nodes) // count if 1 < count < len(nodes) else 1


def request_code(ranks_per_node: int | str | None) -> int:
    """``requested_ranks_per_node``, or ``BAD_REQUEST`` where it raises: what this rank tells the others."""
    try:
        return requested_ranks_per_node(ranks_per_node)
    except ValueError:
        return BAD_REQUEST


def check_requests(asked: list[int], what: str, ranks_per_node: int | str | None) -> None:
    """Raise the same ValueError on every rank when some rank's request (``request_code``, by rank) was bad.

    A rank whose own request was bad adds its reason.
    """
    bad = [r for r, code in enumerate(asked) if code == BAD_REQUEST]
    if not bad:
        return
    reason = ""
    try:
        requested_ranks_per_node(ranks_per_node)
    except ValueError as exc:
        reason = f" (this rank: {exc})"
    raise ValueError(f"{what}: ranks_per_node or {RANKS_PER_NODE_ENV} is not a positive integer on rank(s) {bad}"
                     f"{reason}")


def host_id() -> int:
    """A signed 64-bit hash of this machine's hostname: ranks with the same one share a node."""
    digest = hashlib.blake2b(socket.gethostname().encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little", signed=True)


def _layout(hosts: list[int], ranks_per_node: int) -> list[int]:
    """Node index of every rank, from the requested ranks per node or else from hostnames."""
    size = len(hosts)
    if ranks_per_node:
        if size % ranks_per_node:
            raise LayoutError(
                f"topology: ranks_per_node={ranks_per_node} does not divide the {size} ranks; "
                f"every node must hold the same number of ranks"
            )
        return [r // ranks_per_node for r in range(size)]
    first_rank: dict[int, int] = {}
    for r, host in enumerate(hosts):
        first_rank.setdefault(host, len(first_rank))
    node_of = [first_rank[host] for host in hosts]
    counts = [node_of.count(node) for node in range(len(first_rank))]
    if len(set(counts)) > 1:
        raise LayoutError(
            f"topology: nodes hold different numbers of ranks ({counts}, by hostname); launch the "
            f"same number of ranks per node, pass ranks_per_node=k to group consecutive ranks, "
            f"or use the flat compressed_allreduce"
        )
    return node_of
