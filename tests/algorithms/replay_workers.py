"""Rank-side bodies of the replay tests: calls whose device part is replayed give the reference's bits."""

from __future__ import annotations

import numpy as np
import torch

import compcoll
from compcoll.algorithms.plan import PLANS, Plan
from compcoll.kernels import reference
from tests.algorithms.onebit_workers import assert_errors_match, assert_matches_reference, world_inputs
from tests.shared import world_once

FORMS = ({}, {"protocol": "allgather"}, {"block_size": 64}, {"block_size": 64, "protocol": "allgather"},
         {"block_size": 64, "bits": 4})
"""The forms of ``compressed_allreduce``: one scale (both protocols), a scale per 64 elements (both), 4-bit levels
(whose device part divides with torch: never replayed)."""
NODE_FORMS = ({}, {"protocol": "allgather"}, {"block_size": 64})
"""The forms of ``hierarchical_compressed_allreduce``: one scale (both protocols between nodes), a scale per 64."""


def replayed(options: dict, dtype: torch.dtype) -> bool:
    """Whether calls of a form on ``dtype`` replay: all but the levels, and the allgather protocol's only into float32
    (a 16-bit output is a torch copy of its float32 average)."""
    return options.get("bits", 1) == 1 and (options.get("protocol") != "allgather" or dtype == torch.float32)


def _plan(comm: compcoll.Communicator, numel: int, device: torch.device, options: dict) -> Plan:
    """The one cached plan of ``numel`` elements on ``device`` with ``options``' protocol, block size and bits."""
    (plan,) = [p for p in comm.attached[PLANS].values()
               if (p.numel, p.device, p.protocol, p.block_size, getattr(p, "bits", 1)) ==
               (numel, device, options.get("protocol", "gather_scatter"), options.get("block_size"),
                options.get("bits", 1))]
    return plan


def replayed_matches_reference(comm: compcoll.Communicator, numels: list[int], steps: int, device: str = "cpu",
                               ranks_per_node: int | None = None) -> None:
    """Each form (``FORMS``; with ``ranks_per_node``, the hierarchical ``NODE_FORMS`` on nodes of that many ranks)
    on float32 and bfloat16: ``steps`` calls on fresh inputs into the same input, output and error buffers give the
    reference's output and error buffers at every step, the device part replayed from the fourth call on (the second
    and third recorded it); then the outputs alternating between two buffers (two keys: the first replayed at once,
    the second from its own fourth call), then a new output every call (replayed where one lands on an address
    recorded before), the bits the reference's. ``steps`` is even; the tensors on ``device`` (the CPU's take the
    CUDA path under numba's simulator: ``tests/kernels/cuda_path_checks.py``)."""
    n, rank, k = comm.size, comm.rank, ranks_per_node
    for options in (FORMS if k is None else NODE_FORMS):
        for dtype in (torch.float32, torch.bfloat16):
            for numel in numels:
                if k is None:
                    full = compcoll.padded_numel(numel, n)
                    lengths, call, per_node = (full, full // n), compcoll.compressed_allreduce, {}
                    expect_of, nodes = reference.compressed_allreduce, ()
                else:
                    lengths = compcoll.hierarchical_error_numels(numel, n, k)
                    call, per_node = compcoll.hierarchical_compressed_allreduce, {"ranks_per_node": k}
                    expect_of, nodes = reference.hierarchical_compressed_allreduce, (k,)
                x, outs = (torch.empty(numel, dtype=dtype, device=device),
                           [torch.empty(numel, dtype=dtype, device=device) for _ in range(2)])
                we, se = (torch.zeros(length, device=device) for length in lengths)
                ref_we = [np.zeros(lengths[0], np.float32) for _ in range(n)]
                ref_se = [np.zeros(lengths[1], np.float32) for _ in range(n)]
                for step in range(3 * steps):
                    if step == 1:
                        before = _plan(comm, numel, x.device, options).replays.replayed
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
                        replays = _plan(comm, numel, x.device, options).replays.replayed - before
                        half = steps // 2
                        expect = steps - 3 + phase * (half + max(0, half - 3)) if replayed(options, dtype) else 0
                        assert replays == expect, f"{replays} replays, expected {expect} ({where})"
