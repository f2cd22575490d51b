"""Compile every CPU kernel once into Numba's on-disk cache, so that a job's first call does not pay for it.

Usage: ``python -m compcoll.warmup`` or ``compcoll-warmup`` (``scripts/setup.sh`` runs it). Without it, the first
call of a process that finds no cache compiles the kernels it needs: several seconds on
every rank (8 s measured on a 2-core machine), later calls 1 ms or less.
"""

from __future__ import annotations

import sys
import time

import torch

from . import codecs
from .algorithms.birder import hierarchical_allreduce
from .algorithms.hierarchical import hierarchical_compressed_allreduce, hierarchical_error_numels
from .algorithms.onebit import compressed_allreduce
from .algorithms.reduce_scatter import compressed_reduce_scatter, row_elements
from .comm.base import Communicator
from .comm.single import SingleComm
from .ddp.onebit import BLOCK_SIZE
from .kernels import cpu
from .launcher import run_threads
from .spec import PROTOCOLS, padded_numel


def warm() -> float:
    """Run every kernel specialisation once; return the seconds it took.

    1. Two sizes, each a multiple of the ranks (as ``compressed_reduce_scatter`` takes), with the serial switch
       at ``cpu.FLOOR`` while it runs (``cpu.use_serial_below``: the least it is anywhere): below it (the serial
       twins) and above it in each rank's part (the threaded kernels); and, float32 only, one with more than
       ``FLOOR`` block scales (``code_blocks`` and ``decode_codes`` run one thread a scale, their threaded kernels
       from there).
    2. Each input dtype (float32 reads directly, 16-bit types through the lookup table).
    3. ``compressed_allreduce`` in one piece, in two pieces and with the allgather protocol, each protocol with
       block scales (the DDP hook's default), and with levels; ``hierarchical_allreduce`` and
       ``hierarchical_compressed_allreduce`` (with one scale, with block scales, and allgather between nodes) with
       1 rank per node and with every rank on one node; ``compressed_reduce_scatter`` with signs and with levels;
       and the optimizers' norms by layer, ``codecs.segment_sumsq`` (``_calls``).
    4. All of it on a 1-rank communicator, then on 2 thread ranks of one in-process world: with more than one rank
       the wire rows are strided views (a frame head before each row's bits), which Numba compiles apart from the
       contiguous rows of one rank. Its ranks wait for each other while one compiles: their timeout is an hour
       (the run's 30 s here could take minutes on a slow or busy machine).
    """
    start = time.perf_counter()
    previous = cpu.use_serial_below(cpu.FLOOR)
    try:
        _calls(SingleComm())
        run_threads(_calls, 2, timeout=3600.0)
    finally:
        cpu.use_serial_below(previous)
    return time.perf_counter() - start


def _calls(comm: Communicator) -> None:
    """The calls of ``warm`` on ``comm``."""
    for numel in (10, comm.size * cpu.FLOOR + 10):
        full = padded_numel(numel, comm.size)
        chunk = full // comm.size
        for dtype in (torch.float32, torch.float16, torch.bfloat16):
            for protocol, pieces in (("gather_scatter", 1), ("gather_scatter", 2), ("allgather", 1)):
                compressed_allreduce(torch.ones(numel, dtype=dtype), torch.zeros(full), torch.zeros(chunk), comm,
                                     protocol=protocol, pieces=pieces)
            for protocol in PROTOCOLS:
                compressed_allreduce(torch.ones(numel, dtype=dtype), torch.zeros(full), torch.zeros(chunk), comm,
                                     protocol=protocol, block_size=BLOCK_SIZE)
            for k in sorted({1, comm.size}):
                hierarchical_allreduce(torch.ones(numel, dtype=dtype), comm, ranks_per_node=k)
                shard, sub = hierarchical_error_numels(numel, comm.size, k)
                for block_size, protocol in ((None, "gather_scatter"), (BLOCK_SIZE, "gather_scatter"),
                                             (None, "allgather")):
                    hierarchical_compressed_allreduce(torch.ones(numel, dtype=dtype), torch.zeros(shard),
                                                      torch.zeros(sub), comm, ranks_per_node=k, block_size=block_size,
                                                      protocol=protocol)
            compressed_allreduce(torch.ones(numel, dtype=dtype), torch.zeros(full), torch.zeros(chunk), comm,
                                 block_size=BLOCK_SIZE, bits=3)
            for bits in (1, 3):
                compressed_reduce_scatter(torch.ones(numel, dtype=dtype), torch.empty(numel // comm.size, dtype=dtype),
                                          torch.zeros(comm.size * row_elements(numel, comm.size)), comm, bits=bits)
        codecs.segment_sumsq(torch.ones(numel), (0, 3, numel), torch.empty(2, dtype=torch.float64))
    big = BLOCK_SIZE * cpu.FLOOR * comm.size + 10  # a block scale per BLOCK_SIZE elements: past FLOOR
    full = padded_numel(big, comm.size)
    for protocol in PROTOCOLS:
        compressed_allreduce(torch.ones(big), torch.zeros(full), torch.zeros(full // comm.size), comm,
                             protocol=protocol, block_size=BLOCK_SIZE)
    compressed_reduce_scatter(torch.ones(big), torch.empty(big // comm.size), torch.zeros(
        comm.size * row_elements(big, comm.size)), comm, bits=3)


def cache_dir() -> str:
    """Where Numba keeps the compiled kernels (beside the package, or ``NUMBA_CACHE_DIR``)."""
    return cpu.compensate_encode.stats.cache_path


def main() -> int:
    print(f"compcoll: CPU kernels compiled and cached in {warm():.1f} s ({cache_dir()})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
