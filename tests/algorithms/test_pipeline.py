"""compressed_allreduce in pieces equals the reference bit for bit: 1-4 in-process ranks, real MPI and Gloo ranks."""

from __future__ import annotations

import pytest
import torch

from compcoll.algorithms.pipeline import PIECE_BYTES, default_pieces, piece_bounds
from compcoll.launcher import BACKENDS
from tests.pool import run
from tests.worlds import worlds
from compcoll.spec import BLOCK

WORKERS = "tests.algorithms.pipeline_workers"
SHAPES = [[1], [37], [3, 7, 11], [12289], [100003]]


@pytest.mark.parametrize("backend, world_size", worlds((1, 2, 3, 4), mpi=3, gloo=2))
def test_pieces_match_reference(backend: str, world_size: int) -> None:
    run(f"{WORKERS}:pieces_match_reference", world_size, backend, args=(SHAPES, 2))


@pytest.mark.parametrize("backend", BACKENDS)
def test_pieces_must_agree(backend: str) -> None:
    run(f"{WORKERS}:pieces_must_agree", 2, backend)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("world_size", [1, 3])
def test_pieces_by_node(backend: str, world_size: int) -> None:
    run(f"{WORKERS}:pieces_by_node", world_size, backend)


@pytest.mark.parametrize("chunk,pieces", [(8, 1), (8, 5), (24, 2), (1000, 3), (12296, 7), (100008, 5), (0, 4)])
def test_piece_bounds_cover_the_chunk_from_block_boundaries(chunk: int, pieces: int) -> None:
    bounds = piece_bounds(chunk, pieces)
    assert bounds[0][0] == 0 and bounds[-1][1] == chunk and len(bounds) <= pieces
    assert all(a % BLOCK == 0 and a < b for a, b in bounds if chunk)
    assert all(bounds[i][1] == bounds[i + 1][0] for i in range(len(bounds) - 1))
    assert len(bounds) == min(pieces, max(1, -(-chunk // BLOCK)))


def test_default_pieces_grow_with_the_size_on_the_cpu() -> None:
    assert default_pieces(torch.empty(1000)) == 1
    assert default_pieces(torch.empty(16 * PIECE_BYTES // 4)) == 16
    assert default_pieces(torch.empty(64 << 18)) == 8
