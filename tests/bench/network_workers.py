"""Rank-side bodies of the emulated-network tests (run by compcoll.launcher)."""

from __future__ import annotations

import socket
import time
from pathlib import Path

import torch

import compcoll


def exchange(comm: compcoll.Communicator, nbytes: int) -> None:
    """Every rank all-gathers ``nbytes`` from every other rank and checks what arrived."""
    mine = torch.full((nbytes,), comm.rank + 1, dtype=torch.uint8)
    table = torch.empty(comm.size * nbytes, dtype=torch.uint8)
    comm.allgather(mine, table)
    for r in range(comm.size):
        assert bool((table[r * nbytes:(r + 1) * nbytes] == r + 1).all()), f"block of rank {r} ({socket.gethostname()})"


def sleep(comm: compcoll.Communicator, seconds: float, ready: str) -> None:
    """Hold the rank for ``seconds`` (a job to interrupt), once every rank has come, and it has made the file
    ``<ready>.<rank>`` to say so."""
    comm.barrier()
    Path(f"{ready}.{comm.rank}").touch()
    time.sleep(seconds)
