"""Node discovery and the intra/inter sub-communicators, on 1-6 local ranks."""

from __future__ import annotations

import pytest

from compcoll.comm.topology import RANKS_PER_NODE_ENV, LayoutError, _layout, requested_ranks_per_node
from tests.pool import run


@pytest.mark.parametrize(
    "world_size,ranks_per_node,backend",
    [(1, 1, "mpi"), (4, 2, "mpi"), (4, 2, "gloo"), (6, 2, "mpi"), (6, 3, "gloo"), (3, None, "mpi")],
)
def test_layout(world_size: int, ranks_per_node: int | None, backend: str) -> None:
    run("tests.comm.topology_workers:layout", world_size, backend, args=(ranks_per_node,))


def test_layout_from_environment() -> None:
    run("tests.comm.topology_workers:layout", 4, "mpi", args=(2,), env={RANKS_PER_NODE_ENV: "2"})


@pytest.mark.parametrize("world_size, env, requested, expected", [
    (4, None, "auto", 1), (4, None, None, 1), (4, "2", "auto", 2), (6, "3", "auto", 3), (4, None, 2, 2),
    (4, None, 4, 1), (4, None, 1, 1), (3, "2", "auto", 1),
])
def test_node_size(world_size: int, env: str | None, requested, expected: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """The hierarchical form's ranks per node, or 1 (flat): one host, one node, one rank per node, or nodes that
    cannot be equal all mean flat; "auto" reads ``COMPCOLL_RANKS_PER_NODE`` else the hostnames (in-process ranks)."""
    if env is None:
        monkeypatch.delenv(RANKS_PER_NODE_ENV, raising=False)
    else:
        monkeypatch.setenv(RANKS_PER_NODE_ENV, env)
    run("tests.comm.topology_workers:sizes", world_size, "threads", args=(requested, expected))


def test_uneven_nodes_are_refused_on_every_rank() -> None:
    run("tests.comm.topology_workers:refused", 3, "mpi", args=([2, 2, 2], "does not divide the 3 ranks"))


def test_disagreeing_ranks_are_refused_on_every_rank() -> None:
    run("tests.comm.topology_workers:refused", 4, "gloo", args=([2, 2, 1, 2], "different ranks_per_node"))


def test_a_bad_request_on_one_rank_is_refused_on_every_rank() -> None:
    run("tests.comm.topology_workers:refused", 4, "gloo", args=([2, 2, 0, 2], "not a positive integer on rank(s) [2]"))


def test_hostname_layout() -> None:
    a, b = 11, -7
    assert _layout([a, b, a, b], 0) == [0, 1, 0, 1]
    assert _layout([b, b, a, a, a, b], 0) == [0, 0, 1, 1, 1, 0]
    with pytest.raises(LayoutError, match=r"different numbers of ranks \(\[2, 1\]"):
        _layout([a, a, b], 0)


def testrequested_ranks_per_node_values(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(RANKS_PER_NODE_ENV, raising=False)
    assert requested_ranks_per_node(None) == requested_ranks_per_node("auto") == 0
    assert requested_ranks_per_node(3) == 3
    monkeypatch.setenv(RANKS_PER_NODE_ENV, "4")
    assert requested_ranks_per_node(None) == requested_ranks_per_node("auto") == 4
    monkeypatch.setenv(RANKS_PER_NODE_ENV, "two")
    with pytest.raises(ValueError, match="not a positive integer"):
        requested_ranks_per_node(None)
    for bad in (0, -1, 2.0, True, "Auto", "2"):
        with pytest.raises(ValueError, match="positive integer"):
            requested_ranks_per_node(bad)
