"""Rank-side bodies of the hierarchical allreduce tests (run by compcoll.launcher)."""

from __future__ import annotations

import threading

import numpy as np
import torch

import compcoll
from compcoll.kernels import reference
from tests.shared import world_once
from tests.algorithms.onebit_workers import (
    DTYPES,
    SCALE_NAMES,
    _expect,
    assert_errors_match,
    assert_matches_reference,
    assert_same_on_all_ranks,
    make_input,
    world_inputs,
)

SEED = 20261121
_HOST = threading.local()


def _traffic(comm: compcoll.Communicator, topo: compcoll.Topology, fn, *args, **kwargs):
    """(fn's result, (intra, inter) bytes this rank sent during it)."""
    intra0, inter0 = topo.traffic(comm)
    result = fn(*args, **kwargs)
    intra1, inter1 = topo.traffic(comm)
    return result, (intra1 - intra0, inter1 - inter0)


def _error_buffers(numel: int, n: int, k: int) -> tuple[torch.Tensor, torch.Tensor, list[np.ndarray], list[np.ndarray]]:
    """This rank's zeroed worker and server error buffers for the compensated form on nodes of ``k``, and the
    reference's, one of each per rank."""
    wn, sn = compcoll.hierarchical_error_numels(numel, n, k)
    return (torch.zeros(wn), torch.zeros(sn), [np.zeros(wn, np.float32) for _ in range(n)],
            [np.zeros(sn, np.float32) for _ in range(n)])


def numerics(comm: compcoll.Communicator, k: int, shapes: list[list[int]], steps: int) -> None:
    """Both hierarchical forms equal the reference bit for bit, with the reference's byte counts."""
    n, rank = comm.size, comm.rank
    topo = compcoll.topology(comm, k)
    step = 0
    for dtype in DTYPES:
        for i, shape in enumerate(map(tuple, shapes)):
            scale = SCALE_NAMES[i % 2]
            numel = int(np.prod(shape))
            we, se, ref_we, ref_se = _error_buffers(numel, n, k)
            for call in range(steps):
                xs = world_inputs(comm, call, shape, dtype)
                flat = [x.float().reshape(-1).numpy() for x in xs]
                before = xs[rank].clone()
                where = f"{dtype} shape {shape} call {call}"

                out, sent = _traffic(comm, topo, compcoll.hierarchical_allreduce, xs[rank], comm,
                                     ranks_per_node=k, seed=SEED)
                outs, ref_sent = world_once(comm, reference.hierarchical_allreduce, flat, k, SEED, step)
                step += 1
                assert out.shape == shape and out.dtype == dtype, where
                assert_matches_reference(out, outs[rank], f"1-bit, {where}")
                assert sent == ref_sent[rank], f"1-bit bytes {sent} != {ref_sent[rank]} ({where})"
                assert_same_on_all_ranks(comm, out)

                out, sent = _traffic(comm, topo, compcoll.hierarchical_compressed_allreduce, xs[rank], we, se,
                                     comm, ranks_per_node=k, scale=scale)
                outs, ref_we, ref_se, ref_sent = world_once(comm, reference.hierarchical_compressed_allreduce, flat,
                                                            ref_we, ref_se, k, scale)
                assert_matches_reference(out, outs[rank], f"compensated {scale}, {where}")
                assert_errors_match(we, se, ref_we[rank], ref_se[rank], where)
                assert sent == ref_sent[rank], f"compensated bytes {sent} != {ref_sent[rank]} ({where})"
                assert_same_on_all_ranks(comm, out)
                assert torch.equal(xs[rank], before), f"input was modified ({where})"


def statistics(comm: compcoll.Communicator, k: int, numel: int, calls: int) -> None:
    """Unbiased, really 1-bit, reproducible, and 1/k of the flat algorithm's inter-node bytes.

    Over ``calls`` calls on fixed inputs, the per-element mean of the outputs must sit
    within its predicted standard error of the true average: the statistic
    mean_j (mean_j - true_j)^2 / (var_j / T), chi-square over its degrees of freedom,
    must be near 1 at T = calls / 4 and T = calls alike, so the error shrinks as
    1/sqrt(T), as the variance predicts. A biased estimator makes it grow with T.
    """
    n, rank = comm.size, comm.rank
    topo = compcoll.topology(comm, k)
    xs = world_inputs(comm, 0, (numel,), torch.float32)
    truth = torch.stack([x.double() for x in xs]).mean(dim=0)
    full = compcoll.padded_numel(numel, n)
    sub = full // n
    row_of = torch.arange(numel) // sub
    total = torch.zeros(numel, dtype=torch.float64)
    squares = torch.zeros(numel, dtype=torch.float64)
    stats = []
    for call in range(1, calls + 1):
        out = compcoll.hierarchical_allreduce(xs[rank], comm, ranks_per_node=k, seed=SEED)
        magnitude = out.abs()
        high = torch.zeros(n).scatter_reduce(0, row_of, magnitude, "amax", include_self=False)
        low = torch.zeros(n).scatter_reduce(0, row_of, magnitude, "amin", include_self=False)
        mixed = (high != low).nonzero().flatten().tolist()
        assert not mixed, (f"row {mixed[0]} holds magnitudes {low[mixed[0]]:g} to {high[mixed[0]]:g}: "
                           "not a 1-bit decode")
        total += out.double()
        squares += out.double() ** 2
        if call in (calls // 4, calls):
            mean = total / call
            variance = (squares / call - mean**2) * call / (call - 1)
            live = variance > 0
            stats.append(float((((mean - truth) ** 2)[live] / (variance[live] / call)).mean()))
    for calls_seen, stat in zip((calls // 4, calls), stats):
        assert 0.8 < stat < 1.25, f"chi-square/dof {stat:.3f} after {calls_seen} calls: biased or mis-scaled"
    if rank == 0:
        print(f"chi-square/dof after {calls // 4} and {calls} calls: {stats[0]:.3f} {stats[1]:.3f}")

    again = [compcoll.hierarchical_allreduce(xs[rank], comm, ranks_per_node=k, seed=SEED, step=7) for _ in range(2)]
    assert torch.equal(again[0], again[1]), "same seed and step gave different outputs"
    other_step = compcoll.hierarchical_allreduce(xs[rank], comm, ranks_per_node=k, seed=SEED, step=8)
    other_seed = compcoll.hierarchical_allreduce(xs[rank], comm, ranks_per_node=k, seed=SEED + 1, step=7)
    assert not torch.equal(again[0], other_step), "a new step drew the same bits"
    assert not torch.equal(again[0], other_seed), "a new seed drew the same bits"

    big = make_input(rank, 1, (100003,), torch.float32)
    full = compcoll.padded_numel(big.numel(), n)
    _, (_, flat) = _traffic(comm, topo, compcoll.compressed_allreduce, big, torch.zeros(full), torch.zeros(full // n),
                            comm)
    _, (_, birder) = _traffic(comm, topo, compcoll.hierarchical_allreduce, big, comm, ranks_per_node=k)
    wn, sn = compcoll.hierarchical_error_numels(big.numel(), n, k)
    _, (_, compensated) = _traffic(comm, topo, compcoll.hierarchical_compressed_allreduce, big,
                                   torch.zeros(wn), torch.zeros(sn), comm, ranks_per_node=k)
    for name, inter in (("hierarchical_allreduce", birder), ("hierarchical_compressed_allreduce", compensated)):
        ratio = inter / flat if flat else 0.0
        assert (k == n and inter == 0) or abs(ratio * k - 1) < 0.05, f"{name}: inter-node bytes {inter} vs flat {flat}"
    if rank == 0:
        print(f"inter-node bytes per rank, 100003 elements: flat {flat}, 1-bit {birder}, compensated {compensated}")


def bad_inputs(comm: compcoll.Communicator, k: int) -> None:
    """Collective errors are raised on every rank; the communicator stays usable."""
    n, rank = comm.size, comm.rank
    x = make_input(rank, 0, (999,), torch.float32)
    har, hcar = compcoll.hierarchical_allreduce, compcoll.hierarchical_compressed_allreduce
    wn, sn = compcoll.hierarchical_error_numels(999, n, k)
    we, se = torch.zeros(wn), torch.zeros(sn)
    expected = har(x, comm, ranks_per_node=k, step=3)

    poisoned = x.clone()
    if rank == n - 1:
        poisoned[5] = float("nan")
    _expect(compcoll.NonFiniteError, f"rank(s) [{n - 1}]", har, poisoned, comm, ranks_per_node=k)
    _expect(compcoll.NonFiniteError, f"rank(s) [{n - 1}]" if k == 1 else "rank(s)", hcar, poisoned, we, se, comm,
            ranks_per_node=k)
    assert not we.any() and not se.any(), "a failed call changed the error buffers"
    if n > 1:
        _expect(compcoll.RankMismatchError, "different ranks_per_node", har, x, comm,
                ranks_per_node=k if rank else n)
        _expect(compcoll.RankMismatchError, "sizes differ", har, x[: 999 - (rank == 1)], comm, ranks_per_node=k)
        _expect(compcoll.RankMismatchError, "different worker_error lengths", hcar, x,
                torch.zeros(wn + (rank == 0) * 8), se, comm, ranks_per_node=k)
    _expect(ValueError, f"rank(s) per node: size them with hierarchical_error_numels(999, {n}, {k})", hcar, x,
            torch.zeros(wn + 8), se, comm, ranks_per_node=k)
    if n % (k + 1):
        _expect(ValueError, "does not divide", har, x, comm, ranks_per_node=k + 1)
    _expect(TypeError, "dtype torch.float64", har, x.double(), comm, ranks_per_node=k)
    _expect(ValueError, "step must be", har, x, comm, ranks_per_node=k, step=-1)
    assert torch.equal(har(x, comm, ranks_per_node=k, step=3), expected), "the communicator broke after the errors"


def compensated_blocks(comm: compcoll.Communicator, k: int, shapes: list[list[int]], steps: int) -> None:
    """The compensated form with one scale per block equals the reference bit for bit (outputs, both error buffers,
    intra- and inter-node bytes), for every dtype, both scales and several block sizes."""
    n, rank = comm.size, comm.rank
    topo = compcoll.topology(comm, k)
    case = 0
    for dtype in DTYPES:
        for shape in map(tuple, shapes):
            case += 1
            scale, block = SCALE_NAMES[case % 2], (8, 64, 256)[case % 3]
            numel = int(np.prod(shape))
            we, se, ref_we, ref_se = _error_buffers(numel, n, k)
            for call in range(steps):
                xs = world_inputs(comm, call, shape, dtype)
                where = f"{dtype} shape {shape} block {block} call {call}"
                out, sent = _traffic(comm, topo, compcoll.hierarchical_compressed_allreduce, xs[rank], we, se,
                                     comm, ranks_per_node=k, scale=scale, block_size=block)
                flat = [x.float().reshape(-1).numpy() for x in xs]
                outs, ref_we, ref_se, ref_sent = world_once(comm, reference.hierarchical_compressed_allreduce, flat,
                                                            ref_we, ref_se, k, scale, block)
                assert out.shape == shape and out.dtype == dtype, where
                assert_matches_reference(out, outs[rank], f"compensated blocks {scale}, {where}")
                assert_errors_match(we, se, ref_we[rank], ref_se[rank], where)
                assert sent == ref_sent[rank], f"compensated bytes {sent} != {ref_sent[rank]} ({where})"
                assert_same_on_all_ranks(comm, out)


def compensated_allgather(comm: compcoll.Communicator, k: int, shapes: list[list[int]], steps: int) -> None:
    """The compensated form with the allgather protocol between nodes equals the reference bit for bit (outputs,
    worker errors, server errors untouched, intra- and inter-node bytes) for every dtype and both scales; a
    block_size with it, an unknown protocol, or ranks asking for different protocols raise on every rank."""
    n, rank = comm.size, comm.rank
    topo = compcoll.topology(comm, k)
    for dtype in DTYPES:
        for i, shape in enumerate(map(tuple, shapes)):
            scale = SCALE_NAMES[i % 2]
            numel = int(np.prod(shape))
            wn, sn = compcoll.hierarchical_error_numels(numel, n, k)
            we, se = torch.zeros(wn), torch.randn(sn, generator=torch.Generator().manual_seed(i))
            ref_we = [np.zeros(wn, np.float32) for _ in range(n)]
            ref_se = [se.numpy().copy() for _ in range(n)]
            for call in range(steps):
                xs = world_inputs(comm, call, shape, dtype)
                where = f"{dtype} shape {shape} call {call}"
                out, sent = _traffic(comm, topo, compcoll.hierarchical_compressed_allreduce, xs[rank], we, se,
                                     comm, ranks_per_node=k, scale=scale, protocol="allgather")
                flat = [x.float().reshape(-1).numpy() for x in xs]
                outs, ref_we, ref_se, ref_sent = world_once(comm, reference.hierarchical_compressed_allreduce, flat,
                                                            ref_we, ref_se, k, scale, None, "allgather")
                assert out.shape == shape and out.dtype == dtype, where
                assert_matches_reference(out, outs[rank], f"compensated allgather {scale}, {where}")
                assert_errors_match(we, se, ref_we[rank], ref_se[rank], where)
                assert sent == ref_sent[rank], f"compensated allgather bytes {sent} != {ref_sent[rank]} ({where})"
                assert_same_on_all_ranks(comm, out)
    x = make_input(rank, 0, (999,), torch.float32)
    wn, sn = compcoll.hierarchical_error_numels(999, n, k)
    _expect(ValueError, "block_size=64 needs protocol='gather_scatter'", compcoll.hierarchical_compressed_allreduce,
            x, torch.zeros(wn), torch.zeros(sn), comm, ranks_per_node=k, protocol="allgather", block_size=64)
    _expect(ValueError, "protocol 'ring' is not one of", compcoll.hierarchical_compressed_allreduce,
            x, torch.zeros(wn), torch.zeros(sn), comm, ranks_per_node=k, protocol="ring")
    if n > 1:
        _expect(compcoll.RankMismatchError, "different protocols", compcoll.hierarchical_compressed_allreduce, x,
                torch.zeros(wn), torch.zeros(sn), comm, ranks_per_node=k,
                protocol="allgather" if rank else "gather_scatter")


def interleaved_host() -> int:
    """``comm.topology.host_id`` for ``interleaved``: the host this thread rank was placed on."""
    return _HOST.value


def interleaved(comm: compcoll.Communicator, nodes: int, shapes: list[list[int]], steps: int) -> None:
    """Ranks placed round-robin on ``nodes`` hosts (rank r on host r % nodes: Open MPI's ``--map-by node``, Slurm's
    cyclic distribution), found from their hostnames (the test sets ``topology.host_id`` to ``interleaved_host``):
    the compensated form equals the reference run on the inputs in node order, rank for rank (outputs, both error
    buffers, intra- and inter-node bytes), and Birder's, whose draws are keyed by rank, is alike on every rank."""
    _HOST.value = comm.rank % nodes
    n, rank, k = comm.size, comm.rank, comm.size // nodes
    topo = compcoll.topology(comm)
    assert topo.node_of == tuple(r % nodes for r in range(n)), topo.node_of
    order = [r for node in range(nodes) for r in range(node, n, nodes)]
    position = order.index(rank)
    for i, shape in enumerate(map(tuple, shapes)):
        scale = SCALE_NAMES[i % 2]
        numel = int(np.prod(shape))
        we, se, ref_we, ref_se = _error_buffers(numel, n, k)
        for call in range(steps):
            xs = world_inputs(comm, call, shape, torch.float32)
            in_node_order = [xs[r].reshape(-1).numpy() for r in order]
            where = f"interleaved on {nodes} nodes, shape {shape} call {call}"
            out, sent = _traffic(comm, topo, compcoll.hierarchical_compressed_allreduce, xs[rank], we, se, comm,
                                 scale=scale)
            outs, ref_we, ref_se, ref_sent = world_once(comm, reference.hierarchical_compressed_allreduce,
                                                        in_node_order, ref_we, ref_se, k, scale)
            assert_matches_reference(out, outs[position], f"compensated {scale}, {where}")
            assert_errors_match(we, se, ref_we[position], ref_se[position], where)
            assert sent == ref_sent[position], f"compensated bytes {sent} != {ref_sent[position]} ({where})"
            assert_same_on_all_ranks(comm, out)
            assert_same_on_all_ranks(comm, compcoll.hierarchical_allreduce(xs[rank], comm, seed=SEED, step=call))
