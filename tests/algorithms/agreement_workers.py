"""Rank-side bodies of the agreement round's tests: every call's checks with the round as an allreduce."""

from __future__ import annotations

import compcoll
from compcoll import spec
from compcoll.algorithms.agreement import summed
from tests.algorithms import hierarchical_workers, onebit_workers


def summed_rounds(comm: compcoll.Communicator, shapes: list[list[int]], steps: int, forced: bool) -> None:
    """The agreement as an allreduce (``spec.GATHERED_AGREEMENT_RANKS``, forced down to 0 with ``forced``, as it is
    above 64 ranks): outputs, error buffers and bytes still equal the reference's, with one scale and with block
    scales, and the hierarchical forms' (nodes of 2, where the ranks form them); every bad input, refusal,
    mismatch and NaN still fails on every rank alike. No ``shapes``: the errors only."""
    gathered = spec.GATHERED_AGREEMENT_RANKS
    if forced:
        spec.GATHERED_AGREEMENT_RANKS = 0
    try:
        assert summed(comm), "the agreement rounds are not allreduces"
        if shapes:
            run_numerics(comm, shapes, steps)
        onebit_workers.bad_inputs(comm)
    finally:
        spec.GATHERED_AGREEMENT_RANKS = gathered


def run_numerics(comm: compcoll.Communicator, shapes: list[list[int]], steps: int) -> None:
    """The reference checks of ``summed_rounds``."""
    onebit_workers.numerics(comm, shapes, steps)
    onebit_workers.blockwise(comm, shapes, steps)
    if comm.size % 2 == 0:
        hierarchical_workers.numerics(comm, 2, shapes, steps)
