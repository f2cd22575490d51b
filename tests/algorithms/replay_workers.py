"""Rank-side bodies of the replay tests: calls whose device part is replayed give the reference's bits."""

from __future__ import annotations

import numpy as np
import torch

import compcoll
from compcoll.algorithms.onebit import FlatPlan
from compcoll.algorithms.plan import PLANS
from compcoll.kernels import reference
from tests.algorithms.onebit_workers import assert_errors_match, assert_matches_reference, world_inputs
from tests.shared import world_once

FORMS = ({}, {"protocol": "allgather"}, {"block_size": 64}, {"block_size": 64, "protocol": "allgather"},
         {"block_size": 64, "bits": 4})
"""The call forms: one scale (both protocols), a scale per 64 elements (both), 4-bit levels (whose device part
computes with torch: never replayed)."""


def replayed(form: int, options: dict, dtype: torch.dtype) -> bool:
    """Whether calls of ``FORMS[form]`` on ``dtype`` replay: the first four forms, the allgather protocol's only into
    float32 (a 16-bit output is a torch copy of its float32 average)."""
    return form < 4 and (options.get("protocol") != "allgather" or dtype == torch.float32)


def _plan(comm: compcoll.Communicator, numel: int, device: torch.device, options: dict) -> FlatPlan:
    """The cached plan of ``compressed_allreduce(**options)`` on ``numel`` elements on ``device``."""
    key = (FlatPlan, numel, device, options.get("protocol", "gather_scatter"), None, "l2",
           options.get("block_size"), options.get("bits", 1))
    return comm.attached[PLANS][key]


def replayed_matches_reference(comm: compcoll.Communicator, numels: list[int], steps: int, device: str = "cpu"
                               ) -> None:
    """Each form of ``FORMS`` on float32 and bfloat16: ``steps`` calls on fresh inputs into the same input, output
    and error buffers give the reference's output and error buffers at every step, the device part replayed from
    the fourth call on (the second and third recorded it); then the outputs alternating between two buffers (two
    keys: the first replayed at once, the second from its own fourth call), then a new output every call (replayed
    where one lands on an address recorded before), the bits the reference's. ``steps`` is even; the tensors on ``device``
    (the CPU's take the CUDA path under numba's simulator: ``tests/kernels/cuda_path_checks.py``)."""
    n, rank = comm.size, comm.rank
    for f, options in enumerate(FORMS):
        for dtype in (torch.float32, torch.bfloat16):
            for numel in numels:
                full = compcoll.padded_numel(numel, n)
                x, outs = (torch.empty(numel, dtype=dtype, device=device),
                           [torch.empty(numel, dtype=dtype, device=device) for _ in range(2)])
                we, se = torch.zeros(full, device=device), torch.zeros(full // n, device=device)
                ref_we = [np.zeros(full, np.float32) for _ in range(n)]
                ref_se = [np.zeros(full // n, np.float32) for _ in range(n)]
                for step in range(3 * steps):
                    if step == 1:
                        before = _plan(comm, numel, x.device, options).replays.replayed
                    phase, where = step // steps, f"{options} {dtype} {numel} step {step}"
                    out = (outs[0], outs[step % 2], torch.empty(numel, dtype=dtype, device=device))[phase]
                    xs = world_inputs(comm, step, (numel,), dtype)
                    x.copy_(xs[rank])
                    got = compcoll.compressed_allreduce(x, we, se, comm, out=out, **options)
                    expected, ref_we, ref_se, _ = world_once(comm, reference.compressed_allreduce,
                                                             [v.float().numpy() for v in xs], ref_we, ref_se,
                                                             **options)
                    assert got is out, where
                    assert_matches_reference(out.cpu(), expected[rank], where)
                    assert_errors_match(we.cpu(), se.cpu(), ref_we[rank], ref_se[rank], where)
                    if step in (steps - 1, 2 * steps - 1):
                        replays = _plan(comm, numel, x.device, options).replays.replayed - before
                        half = steps // 2
                        expect = steps - 3 + phase * (half + max(0, half - 3)) if replayed(f, options, dtype) else 0
                        assert replays == expect, f"{replays} replays, expected {expect} ({where})"
