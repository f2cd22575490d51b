"""Rank-side bodies of the agreement round's tests: every call's checks, the round an allreduce or on device.

On device: the round's record written and gathered where the call's tensors are.
"""

from __future__ import annotations

import numpy as np
import torch

import compcoll
from compcoll import spec
from compcoll.algorithms.agreement import Agreement
from compcoll.algorithms.rounds import summed
from compcoll.kernels import reference
from tests.algorithms import hierarchical_workers, onebit_workers, reduce_scatter_workers
from tests.optim import optim_workers


def assert_rounds_on_device(plans: list, where: str = "") -> None:
    """Every agreement of ``plans`` laid out for a round on the device (``Agreement.slot``), and there is one."""
    spaces = [a._space for p in plans for a in p._agreements.values()]
    assert spaces and all(space is not None and space.numel() > 1 for space in spaces), f"a round on the host {where}"


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
    """The reference checks of ``summed_rounds``: the flat forms, the reduce-scatter (FSDP2's) and the hierarchical
    forms (both protocols between nodes: the allgather protocol's server weighs its senders in a transpose of the
    rank order)."""
    onebit_workers.numerics(comm, shapes, steps)
    onebit_workers.blockwise(comm, shapes, steps)
    reduce_scatter_workers.numerics(comm, [1, 37, 1000], steps)
    if comm.size % 2 == 0:
        hierarchical_workers.numerics(comm, 2, shapes, steps)
        hierarchical_workers.compensated_allgather(comm, 2, shapes, steps)


def device_rounds(comm: compcoll.Communicator, shapes: list[list[int]], steps: int, errors: bool = True,
                  forced: bool = False) -> None:
    """The round on the device (``Communicator.agrees_on_device``, NCCL's, set here on a transport of host tensors):
    every call's record is written beside its sum and all-gathered with it (``Agreement.check_record``), and
    outputs, error buffers and bytes equal the reference's, with one scale, block scales, the reduce-scatter, the
    hierarchical forms and Birder's; with ``errors``, 1-bit LAMB by layer and 0/1 Adam equal their references
    (rounds on a vector's finiteness: the layered channel's, 0/1 Adam's local steps'), a NaN in a local step skips
    it on every rank, ranks at different steps fail alike, and every bad input, refusal, mismatch and NaN fails on
    every rank alike, a refusing rank taking part with a host record. ``forced``: the rounds are allreduces
    (``summed_rounds``)."""
    comm.agrees_on_device = True
    gathered = spec.GATHERED_AGREEMENT_RANKS
    if forced:
        spec.GATHERED_AGREEMENT_RANKS = 0
    try:
        assert summed(comm) == forced
        assert Agreement(comm, "x", 1, (1,), torch.float32).on_device(), "the round is not on the device"
        run_numerics(comm, shapes, steps)
        if errors:
            optim_workers.onebit_lamb_reference(comm, 6, layer_scales=True)
            optim_workers.zero_one_adam_reference(comm, 8)
            optim_workers.nonfinite(comm, "ZeroOneAdam", 11, "skip")
            if comm.size > 1:
                optim_workers.step_mismatch(comm, "ZeroOneAdam", "resume")
            onebit_workers.bad_inputs(comm)
            reduce_scatter_workers.bad_inputs(comm)
            hierarchical_workers.bad_inputs(comm, 1)
    finally:
        comm.agrees_on_device = False
        spec.GATHERED_AGREEMENT_RANKS = gathered


def rounds_moved(comm: compcoll.Communicator, numel: int, calls: int) -> None:
    """A communicator set to agree on the device after its first calls, and back (every rank alike): the flat form's
    outputs and error buffers equal the reference's at every call, its agreements' buffers laid out anew for the
    round's kind each time."""
    n, rank = comm.size, comm.rank
    full = compcoll.padded_numel(numel, n)
    we, se = torch.zeros(full), torch.zeros(full // n)
    ref_we, ref_se = [np.zeros(full, np.float32) for _ in range(n)], [np.zeros(full // n, np.float32) for _ in range(n)]
    try:
        for call in range(3 * calls):
            comm.agrees_on_device = call // calls == 1
            xs = onebit_workers.world_inputs(comm, call, (numel,), torch.float32)
            out = compcoll.compressed_allreduce(xs[rank], we, se, comm)
            outs, ref_we, ref_se, _ = reference.compressed_allreduce([x.numpy() for x in xs], ref_we, ref_se)
            where = f"call {call}, rounds on the device: {comm.agrees_on_device}"
            onebit_workers.assert_matches_reference(out, outs[rank], where)
            onebit_workers.assert_errors_match(we, se, ref_we[rank], ref_se[rank], where)
    finally:
        comm.agrees_on_device = False
