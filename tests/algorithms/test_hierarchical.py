"""hierarchical_allreduce and hierarchical_compressed_allreduce at 1-6 ranks, as N nodes x k ranks."""

from __future__ import annotations

import pytest

from compcoll.comm import topology
from compcoll.comm.topology import RANKS_PER_NODE_ENV
from tests.algorithms import hierarchical_workers
from tests.pool import run

WORKERS = "tests.algorithms.hierarchical_workers"
SHAPES = [[1], [37], [3, 7, 11], [12289], [1920]]
"""Shapes called; 1920 elements are a multiple of 8n at every world size here, so a float32 input is sent as its own
rows (``exact.shard_average``) where the others are padded."""
LAYOUTS = [(1, 1), (3, 1), (2, 2), (4, 2), (6, 2), (6, 3)]


@pytest.mark.parametrize("world_size,k", LAYOUTS)
def test_matches_reference(world_size: int, k: int) -> None:
    run(f"{WORKERS}:numerics", world_size, "threads", args=(k, SHAPES, 2), timeout=300)


def test_matches_reference_over_mpi() -> None:
    run(f"{WORKERS}:numerics", 6, "mpi", args=(3, SHAPES, 2), timeout=300)


def test_matches_reference_over_gloo() -> None:
    run(f"{WORKERS}:numerics", 4, "gloo", args=(2, SHAPES, 2), timeout=300)


@pytest.mark.parametrize("world_size,k", [(4, 2), (6, 2), (6, 3)])
def test_unbiased_one_bit_and_a_kth_of_the_inter_node_bytes(world_size: int, k: int) -> None:
    run(f"{WORKERS}:statistics", world_size, "threads", args=(k, 1001, 400), timeout=300)


@pytest.mark.parametrize("world_size,k,backend", [(1, 1, "threads"), (4, 2, "threads"), (6, 2, "threads"),
                                                  (4, 2, "mpi"), (6, 3, "gloo")])
def test_bad_inputs_raise_on_every_rank(world_size: int, k: int, backend: str) -> None:
    run(f"{WORKERS}:bad_inputs", world_size, backend, args=(k,))


@pytest.mark.parametrize("backend, world_size, k", [("threads", 4, 2), ("threads", 6, 3), ("threads", 8, 4),
                                                    ("mpi", 4, 2), ("gloo", 4, 2)])
def test_compensated_block_scales_match_reference(backend: str, world_size: int, k: int) -> None:
    run(f"{WORKERS}:compensated_blocks", world_size, backend, args=(k, [[1], [37], [3, 7, 11], [12289]], 2),
        timeout=300)


@pytest.mark.parametrize("backend, world_size, k", [("threads", 1, 1), ("threads", 3, 1), ("threads", 4, 2),
                                                    ("threads", 6, 2), ("threads", 6, 3), ("mpi", 4, 2),
                                                    ("gloo", 6, 3)])
def test_compensated_allgather_between_nodes_matches_reference(backend: str, world_size: int, k: int) -> None:
    run(f"{WORKERS}:compensated_allgather", world_size, backend, args=(k, SHAPES, 2), timeout=300)


@pytest.mark.parametrize("world_size, nodes", [(8, 2), (6, 3)])
def test_ranks_placed_round_robin_on_nodes_match_the_reference_in_node_order(
        world_size: int, nodes: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """Hostnames that interleave the nodes (``--map-by node``, cyclic placement): ``ranks_per_node="auto"`` finds
    them, and each rank gets the reference's bits for its place in node order (``interleaved``)."""
    monkeypatch.delenv(RANKS_PER_NODE_ENV, raising=False)
    monkeypatch.setattr(topology, "host_id", hierarchical_workers.interleaved_host)
    run(f"{WORKERS}:interleaved", world_size, "threads", args=(nodes, SHAPES, 2), timeout=300)
