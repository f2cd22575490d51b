"""Rank-side bodies of the pipelined gather-scatter tests: pieces give the reference's bits, bytes and errors."""

from __future__ import annotations

import os

import torch

import compcoll
from compcoll.algorithms.pipeline import PIECE_BYTES, agree_pieces, default_pieces
from compcoll.comm.topology import RANKS_PER_NODE_ENV
from tests.algorithms.onebit_workers import DTYPES, SCALE_NAMES, _expect, make_input, steps_match_reference


def pieces_match_reference(comm: compcoll.Communicator, shapes: list[list[int]], steps: int) -> None:
    """Outputs, both error buffers and bytes sent equal the reference in 2, 3 and 5 pieces (odd steps asynchronous),
    the shapes taking the scales in turn."""
    for dtype in DTYPES:
        for pieces in (2, 3, 5):
            for i, shape in enumerate(map(tuple, shapes)):
                scale = SCALE_NAMES[(i + pieces) % 2]
                steps_match_reference(comm, shape, dtype, steps, lambda step: step % 2 == 1,
                                      dict(pieces=pieces, scale=scale), dict(scale=scale))


def pieces_must_agree(comm: compcoll.Communicator) -> None:
    """Ranks asking for different numbers of pieces raise RankMismatchError on every rank; a bad count raises
    locally."""
    n, rank = comm.size, comm.rank
    full = compcoll.padded_numel(5000, n)
    we, se = torch.zeros(full), torch.zeros(full // n)
    x = make_input(rank, 0, (5000,), torch.float32)
    _expect(ValueError, "pieces must be a positive integer", compcoll.compressed_allreduce, x, we, se, comm, pieces=0)
    _expect(compcoll.RankMismatchError, "different pieces", compcoll.compressed_allreduce, x, we, se, comm,
            pieces=2 + rank)
    assert not we.any() and not se.any(), "a refused call changed the error buffers"


def pieces_by_node(comm: compcoll.Communicator) -> None:
    """Pieces left to compcoll: 1 with every rank on this host; the size's pieces, and the same bits as asking for
    them, when COMPCOLL_RANKS_PER_NODE=1 makes each rank a node; a bad value raises on every rank."""
    n, rank = comm.size, comm.rank
    large = torch.empty(1).expand(64 << 18)
    assert agree_pieces(comm, large) == 1
    os.environ[RANKS_PER_NODE_ENV] = "1"
    try:
        assert agree_pieces(comm, large) == (default_pieces(large) if n > 1 else 1)
        assert agree_pieces(comm, torch.empty(1000)) == 1
        x = make_input(rank, 0, (3 * PIECE_BYTES // 4 + 5,), torch.float32)
        full = compcoll.padded_numel(x.numel(), n)
        outs = []
        for pieces in (None, 3):
            we, se = torch.zeros(full), torch.zeros(full // n)
            outs += [compcoll.compressed_allreduce(x, we, se, comm, pieces=pieces), we, se]
        assert all(torch.equal(a, b) for a, b in zip(outs[:3], outs[3:])), "left to compcoll != 3 pieces"
        os.environ[RANKS_PER_NODE_ENV] = "one" if rank == n - 1 else "1"
        _expect(ValueError, f"{RANKS_PER_NODE_ENV} is not a positive integer on rank(s) [{n - 1}]",
                agree_pieces, comm, large)
    finally:
        del os.environ[RANKS_PER_NODE_ENV]
