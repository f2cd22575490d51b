"""Rank-side bodies of the replay tests: calls whose device part is replayed give the reference's bits."""

from __future__ import annotations

import numpy as np
import torch

import compcoll
from compcoll.algorithms.birder import BirderPlan
from compcoll.algorithms.hierarchical import CompensatedPlan
from compcoll.algorithms.onebit import FlatPlan
from compcoll.algorithms.plan import PLANS
from compcoll.algorithms.reduce_scatter import ScatterPlan, row_elements
from compcoll.kernels import reference
from tests.algorithms.agreement_workers import assert_rounds_on_device
from tests.algorithms.onebit_workers import assert_errors_match, assert_matches_reference, world_inputs
from tests.shared import world_once

FORMS = ({}, {"protocol": "allgather"}, {"block_size": 64}, {"block_size": 64, "protocol": "allgather"},
         {"block_size": 64, "bits": 4})
"""The forms of ``compressed_allreduce``: one scale (both protocols), a scale per 64 elements (both), 4-bit levels
(whose device part divides in place with torch: a recorded operator)."""
NODE_FORMS = ({}, {"protocol": "allgather"}, {"block_size": 64})
"""The forms of ``hierarchical_compressed_allreduce``: one scale (both protocols between nodes), a scale per 64."""
SCATTER_FORMS = ({"op": "avg"}, {"op": "premul_sum", "factor": 0.37, "bits": 4}, {"op": "sum", "block_size": 8})
"""The forms of ``compressed_reduce_scatter`` (FSDP2's): each op, 1 bit and 4-bit levels."""


def _replays(comm: compcoll.Communicator, numel: int, device: torch.device, kind: type, **fields) -> int:
    """The replays of the device part after the agreement (``finish_flat``, ``finish_blocks``, ``finish``) of the one
    cached plan of ``kind`` on ``numel`` elements on ``device`` with ``fields``."""
    (plan,) = [p for p in comm.attached[PLANS].values()
               if type(p) is kind and (p.numel, p.device) == (numel, device)
               and all(getattr(p, name) == value for name, value in fields.items())]
    return sum(count for part, count in plan.replays.counts.items() if part.startswith("finish"))


def _pieces_agreed(comm: compcoll.Communicator, numel: int, device: torch.device) -> bool:
    """Whether the flat gather-scatter plan with one scale on ``numel`` elements on ``device`` exists and has agreed
    its pieces (at its first call: ``pipeline.agree_pieces``)."""
    return any(type(p) is FlatPlan and (p.numel, p.device, p.protocol, p.block_size) ==
               (numel, device, "gather_scatter", None) and p.pieces is not None
               for p in comm.attached.get(PLANS, {}).values())


def _expected(steps: int, phase: int) -> int:
    """Replays at the end of ``phase`` (0: one output; 1: then two alternating) of ``steps`` calls each: from each
    key's fourth call."""
    half = steps // 2
    return steps - 3 + phase * (half + max(0, half - 3))


def replayed_matches_reference(comm: compcoll.Communicator, numels: list[int], steps: int, device: str = "cpu",
                               ranks_per_node: int | None = None) -> None:
    """Each form (``FORMS``; with ``ranks_per_node``, the hierarchical ``NODE_FORMS`` on nodes of that many ranks)
    on float32 and bfloat16: ``steps`` calls on fresh inputs into the same input, output and error buffers give the
    reference's output and error buffers at every step, the device part replayed from the fourth call on (the second
    and third recorded it); then the outputs alternating between two buffers (two keys: the first replayed at once,
    the second from its own fourth call), then a new output every call (replayed where one lands on an address
    recorded before), the bits the reference's. With the rounds on the device (``replayed_on_the_device``) the
    flat form with one scale replays from the fifth call of a new plan: its first, whose pieces are not yet agreed,
    takes the host's scalars (another key). ``steps`` is even; the tensors on ``device`` (the CPU's take the CUDA
    path under numba's simulator: ``tests/kernels/cuda_path_checks.py``)."""
    n, rank, k = comm.size, comm.rank, ranks_per_node
    for options in (FORMS if k is None else NODE_FORMS):
        for dtype in (torch.float32, torch.bfloat16):
            for numel in numels:
                fields = {"protocol": options.get("protocol", "gather_scatter"), "block_size":
                          options.get("block_size")}
                if k is None:
                    full = compcoll.padded_numel(numel, n)
                    lengths, call, per_node = (full, full // n), compcoll.compressed_allreduce, {}
                    expect_of, nodes, kind = reference.compressed_allreduce, (), FlatPlan
                    fields["bits"] = options.get("bits", 1)
                else:
                    lengths = compcoll.hierarchical_error_numels(numel, n, k)
                    call, per_node = compcoll.hierarchical_compressed_allreduce, {"ranks_per_node": k}
                    expect_of, nodes, kind = reference.hierarchical_compressed_allreduce, (k,), CompensatedPlan
                x, outs = (torch.empty(numel, dtype=dtype, device=device),
                           [torch.empty(numel, dtype=dtype, device=device) for _ in range(2)])
                we, se = (torch.zeros(length, device=device) for length in lengths)
                late = int(comm.agrees_on_device and k is None and options == {}
                           and not _pieces_agreed(comm, numel, x.device))
                ref_we = [np.zeros(lengths[0], np.float32) for _ in range(n)]
                ref_se = [np.zeros(lengths[1], np.float32) for _ in range(n)]
                for step in range(3 * steps):
                    if step == 1:
                        before = _replays(comm, numel, x.device, kind, **fields)
                    phase, where = step // steps, f"{k} {options} {dtype} {numel} step {step}"
                    out = (outs[0], outs[step % 2], torch.empty(numel, dtype=dtype, device=device))[phase]
                    xs = world_inputs(comm, step, (numel,), dtype)
                    x.copy_(xs[rank])
                    got = call(x, we, se, comm, out=out, **per_node, **options)
                    expected, ref_we, ref_se, _ = world_once(comm, expect_of, [v.float().numpy() for v in xs],
                                                             ref_we, ref_se, *nodes, **options)
                    assert got is out, where
                    assert_matches_reference(out.cpu(), expected[rank], where)
                    assert_errors_match(we.cpu(), se.cpu(), ref_we[rank], ref_se[rank], where)
                    if step in (steps - 1, 2 * steps - 1):
                        replays = _replays(comm, numel, x.device, kind, **fields) - before
                        assert replays == _expected(steps, phase) - late, f"{replays} replays ({where})"


def replayed_on_the_device(comm: compcoll.Communicator, numels: list[int], steps: int, device: str = "cpu",
                           ranks_per_node: int | None = None) -> None:
    """``replayed_matches_reference`` with every call's agreement round on the device
    (``Communicator.agrees_on_device``, NCCL's, set here on a transport of host tensors): the flat form in one piece
    and the hierarchical gather-scatter form derive s_w and the server's weights from the round's sums in the
    encode's own launch (``codecs.compensate_encode_agreed``), replayed as any device part; the bits the
    reference's at every step, every round on the device and every flat call in one piece."""
    comm.agrees_on_device = True
    try:
        replayed_matches_reference(comm, numels, steps, device, ranks_per_node)
        plans = [p for p in comm.attached[PLANS].values() if isinstance(p, (FlatPlan, CompensatedPlan))]
        assert_rounds_on_device(plans)
        assert all(p.protocol == "allgather" or p.pieces == 1 for p in plans
                   if type(p) is FlatPlan and p.block_size is None), "a flat call in pieces"
    finally:
        comm.agrees_on_device = False


def scatter_replayed_matches_reference(comm: compcoll.Communicator, row: int, steps: int, device: str = "cpu"
                                       ) -> None:
    """``compressed_reduce_scatter`` (``SCATTER_FORMS``, float32 and bfloat16) as ``replayed_matches_reference``:
    ``steps`` calls into one output, then ``steps`` alternating between two; the output and the worker error the
    reference's at every step, replayed from each key's fourth call."""
    n, rank = comm.size, comm.rank
    for options in SCATTER_FORMS:
        block, bits = options.get("block_size", 64), options.get("bits", 1)
        for dtype in (torch.float32, torch.bfloat16):
            x, outs = (torch.empty(n * row, dtype=dtype, device=device),
                       [torch.empty(row, dtype=dtype, device=device) for _ in range(2)])
            error = torch.zeros(n * row_elements(n * row, n), device=device)
            ref_errors = [np.zeros(error.numel(), np.float32) for _ in range(n)]
            for step in range(2 * steps):
                if step == 1:
                    before = _replays(comm, n * row, x.device, ScatterPlan, op=options["op"], bits=bits)
                phase, where = step // steps, f"{options} {dtype} {row} step {step}"
                out = outs[0] if phase == 0 else outs[step % 2]
                xs = world_inputs(comm, step, (n * row,), dtype)
                x.copy_(xs[rank])
                compcoll.compressed_reduce_scatter(x, out, error, comm, **{"block_size": block, **options})
                expected, ref_errors, _ = world_once(comm, reference.compressed_reduce_scatter,
                                                     [v.float().numpy() for v in xs], ref_errors, block, "l2",
                                                     options["op"], options.get("factor", 1.0), bits)
                assert_matches_reference(out.cpu(), expected[rank], where)
                assert np.array_equal(error.cpu().numpy(), ref_errors[rank]), f"worker error ({where})"
                if step in (steps - 1, 2 * steps - 1):
                    replays = _replays(comm, n * row, x.device, ScatterPlan, op=options["op"], bits=bits) - before
                    assert replays == _expected(steps, phase), f"{replays} replays ({where})"


def birder_replayed_matches_reference(comm: compcoll.Communicator, numel: int, steps: int, device: str = "cpu",
                                      ranks_per_node: int = 1) -> None:
    """``hierarchical_allreduce`` (Birder's) on float32 and bfloat16, on nodes of ``ranks_per_node``: ``steps`` calls
    on fresh inputs into one input and output, each with its own seed and step, give the reference's bits at every
    step, its device part replayed from the fourth call on with each call's random streams."""
    rank, k = comm.rank, ranks_per_node
    for dtype in (torch.float32, torch.bfloat16):
        x, out = torch.empty(numel, dtype=dtype, device=device), torch.empty(numel, dtype=dtype, device=device)
        for call in range(steps):
            if call == 1:
                before = _replays(comm, numel, x.device, BirderPlan)
            seed, step, where = 11 + call % 3, 5 * call + 2, f"{k} {dtype} {numel} call {call}"
            xs = world_inputs(comm, call, (numel,), dtype)
            x.copy_(xs[rank])
            assert compcoll.hierarchical_allreduce(x, comm, ranks_per_node=k, seed=seed, step=step, out=out) is out
            expected, _ = world_once(comm, reference.hierarchical_allreduce, [v.float().numpy() for v in xs], k,
                                     seed, step)
            assert_matches_reference(out.cpu(), expected[rank], where)
        replays = _replays(comm, numel, x.device, BirderPlan) - before
        assert replays == steps - 3, f"{replays} replays of {steps} calls ({k} {dtype} {numel})"
