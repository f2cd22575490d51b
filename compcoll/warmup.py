"""Compile every CPU kernel once into Numba's on-disk cache, so that a job's first call does not pay for it.

Usage: ``python -m compcoll.warmup`` or ``compcoll-warmup`` (``scripts/setup.sh`` runs it). Without it, the first
call of a process that finds no cache compiles the kernels it needs: several seconds on
every rank (8 s measured on a 2-core machine), later calls 1 ms or less.
"""

from __future__ import annotations

import sys
import time

import torch

from .algorithms.hierarchical import hierarchical_allreduce
from .algorithms.onebit import compressed_allreduce
from .algorithms.reduce_scatter import compressed_reduce_scatter, row_elements
from .comm.single import SingleComm
from .ddp.onebit import BLOCK_SIZE
from .kernels import cpu
from .spec import PROTOCOLS, padded_numel


def warm() -> float:
    """Run every kernel specialisation once; return the seconds it took.

    1. Two sizes: below ``SERIAL_BELOW`` (the serial twins) and above (the threaded kernels).
    2. Each input dtype (float32 reads directly, 16-bit types through the lookup table).
    3. ``compressed_allreduce`` in one piece, in two pieces and with the allgather
       protocol, each protocol with block scales (the DDP hook's default), and
       ``hierarchical_allreduce``, and ``compressed_reduce_scatter`` with signs and with levels, on a 1-rank
       communicator.
    """
    start = time.perf_counter()
    comm = SingleComm()
    for numel in (9, cpu.SERIAL_BELOW + 9):
        full = padded_numel(numel, 1)
        for dtype in (torch.float32, torch.float16, torch.bfloat16):
            for protocol, pieces in (("gather_scatter", 1), ("gather_scatter", 2), ("allgather", 1)):
                compressed_allreduce(torch.ones(numel, dtype=dtype), torch.zeros(full), torch.zeros(full), comm,
                                     protocol=protocol, pieces=pieces)
            for protocol in PROTOCOLS:
                compressed_allreduce(torch.ones(numel, dtype=dtype), torch.zeros(full), torch.zeros(full), comm,
                                     protocol=protocol, block_size=BLOCK_SIZE)
            hierarchical_allreduce(torch.ones(numel, dtype=dtype), comm, ranks_per_node=1)
            for bits in (1, 3):
                compressed_reduce_scatter(torch.ones(numel, dtype=dtype), torch.empty(numel, dtype=dtype),
                                          torch.zeros(row_elements(numel, 1)), comm, bits=bits)
    return time.perf_counter() - start


def cache_dir() -> str:
    """Where Numba keeps the compiled kernels (beside the package, or ``NUMBA_CACHE_DIR``)."""
    return cpu.compensate_encode.stats.cache_path


def main() -> int:
    print(f"compcoll: CPU kernels compiled and cached in {warm():.1f} s ({cache_dir()})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
