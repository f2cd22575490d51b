"""comm.tally: a tally's bytes by rank are those of counting every peer's share apart, children included.

The model is the accounting before 2026-12-05 (every count a dict of every peer, added here and in every parent,
translated to its rank numbers). The transports' counts of each collective, and a split's in its parent's, are
tests/comm/comm_workers.collectives'.
"""

from __future__ import annotations

import random

import pytest

from compcoll.comm.tally import Tally


class Model:
    """Every count a dict of every peer's bytes, added here and, translated, in every parent."""

    def __init__(self, rank: int, size: int, parent: tuple[Model, list[int]] | None = None) -> None:
        self.rank, self.size, self.parent = rank, size, parent
        self.sent, self.total = [0] * size, 0

    def spread(self, total: int) -> None:
        peers = [p for p in range(self.size) if p != self.rank]
        if not peers:
            return
        share, extra = divmod(total, len(peers))
        sent: dict[int, int] = {peer: share + (i < extra) for i, peer in enumerate(peers)}
        node: Model | None = self
        while node is not None:
            for peer, nbytes in sent.items():
                node.sent[peer] += nbytes
            node.total += sum(sent.values())
            if node.parent is None:
                break
            parent, ranks = node.parent
            sent = {ranks[peer]: nbytes for peer, nbytes in sent.items()}
            node = parent


@pytest.mark.parametrize("size, rank, seed", [(1, 0, 0), (2, 1, 1), (7, 3, 2), (12, 0, 3), (12, 11, 4), (65, 40, 5)])
def test_a_tally_counts_as_every_peer_counted_apart(size: int, rank: int, seed: int) -> None:
    """Random totals (remainders of every size among them) on a tally, its children (every third rank, and the ranks
    of rank's half) and a grandchild: ``by_rank`` and ``total`` of each equal the model's, read between counts
    too."""
    gen = random.Random(seed)
    root, model = Tally(rank, size), Model(rank, size)
    nodes = [(root, model)]
    for members in (list(range(rank % 3, size, 3)), [r for r in range(size) if (r < size // 2) == (rank < size // 2)]):
        me = members.index(rank)
        child, child_model = Tally(me, len(members)), Model(me, len(members), (model, members))
        root.adopt(child, members)
        nodes.append((child, child_model))
    child, child_model = nodes[-1]
    inner = list(range(child.rank % 2, child.size, 2))
    grandchild = Tally(inner.index(child.rank), len(inner))
    child.adopt(grandchild, inner)
    nodes.append((grandchild, Model(grandchild.rank, grandchild.size, (child_model, inner))))
    for _ in range(200):
        tally, reference = gen.choice(nodes)
        total = gen.choice([0, 1, gen.randrange(1, 4 * size), gen.randrange(10 ** 6)])
        tally.spread(total)
        reference.spread(total)
        if gen.random() < 0.1:
            assert [(t.by_rank(), t.total) for t, _ in nodes] == [(m.sent, m.total) for _, m in nodes]
    assert [(t.by_rank(), t.total) for t, _ in nodes] == [(m.sent, m.total) for _, m in nodes]
    assert (root.total > 0 or size == 1) and sum(root.by_rank()) == root.total


def test_seconds_waited_add_up_in_every_parent() -> None:
    """A grandchild's wait counts in its parent and the root; a child's in the root alone; the root's in itself."""
    root, child, grandchild = Tally(0, 4), Tally(0, 2), Tally(0, 1)
    root.adopt(child, [0, 2])
    child.adopt(grandchild, [0])
    grandchild.wait(0.5)
    child.wait(0.25)
    root.wait(0.125)
    assert (root.waited, child.waited, grandchild.waited) == (0.875, 0.75, 0.5)
