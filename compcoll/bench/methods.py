"""The benchmark's methods, one record each: how to run one call and how to verify it (as nccl-tests' specs)."""

from __future__ import annotations

import argparse
import zlib
from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch

import compcoll
from compcoll.algorithms.pipeline import default_pieces
from compcoll.comm import Communicator
from compcoll.kernels import reference
from compcoll import spec
from compcoll.spec import SCALE_BYTES

from .peers import PEERS, ddp_hook_step, hook_bytes

REFERENCE_LIMIT = 1 << 20
"""Largest world input (elements over all ranks) verified against the numpy reference."""

Step = Callable[[], object]
Verify = Callable[[], int]
Build = Callable[[Communicator, compcoll.Topology, torch.Tensor, argparse.Namespace], tuple[Step, Verify]]
Pieces = Callable[[argparse.Namespace, compcoll.Topology, torch.Tensor], int]


@dataclass(frozen=True)
class Method:
    """One way of averaging a float32 tensor, measured side by side with the others.

    Attributes:
        name: the ``--methods`` name.
        summary: one line for ``--help``.
        build: (comm, topology, input, args) -> (one call, a verification returning the
            number of wrong elements).
        counted: whether its traffic goes through the communicator (its bytes and waits
            are counted there); PyTorch's hooks send through DDP instead.
        pieces: (args, topology, input) -> the pieces a ``compressed_allreduce`` method runs in
            (recorded in the report for the model); None for the others.
        sent: for a method the communicator does not count, (world size, input, args) ->
            the bytes one rank sends per call.
    """

    name: str
    summary: str
    build: Build
    counted: bool = True
    pieces: Pieces | None = None
    sent: Callable[[int, torch.Tensor, argparse.Namespace], int] | None = None


def make_input(rank: int, count: int) -> torch.Tensor:
    """Rank ``rank``'s fresh random input of ``count`` float32 elements (the same in every run)."""
    return torch.randn(count, generator=torch.Generator().manual_seed(12345 + rank))


def count_wrong(comm: Communicator, out: torch.Tensor,
                simulate: Callable[[list[np.ndarray]], np.ndarray] | None) -> int:
    """Wrong elements of one call's ``out``: against the reference (small sizes) and across ranks.

    1. If ``simulate`` is given and the world's inputs are small enough, compare with
       ``simulate(every rank's input)``, the reference's output for this rank.
    2. All-gather a checksum of ``out``; if any rank differs, every element counts as wrong.
    """
    wrong = 0
    if simulate is not None and out.numel() * comm.size <= REFERENCE_LIMIT:
        expected = simulate([make_input(r, out.numel()).numpy() for r in range(comm.size)])
        wrong = int((out.numpy() != expected).sum())
    checksums = torch.empty(comm.size, dtype=torch.int64)
    comm.allgather(torch.tensor([zlib.crc32(out.numpy().tobytes())]), checksums)
    return wrong + int((checksums != checksums[0]).sum()) * out.numel()


def _consecutive(topo: compcoll.Topology) -> bool:
    """Whether node = rank // k, the layout the reference simulates."""
    return topo.node_of == tuple(r // topo.ranks_per_node for r in range(len(topo.node_of)))


def _plain(comm: Communicator, topo: compcoll.Topology, x: torch.Tensor,
           args: argparse.Namespace) -> tuple[Step, Verify]:
    """The communicator's allreduce, then / n; verified against the sum of every rank's input."""
    n, plain = comm.size, x.clone()

    def step() -> None:
        plain.copy_(x)
        comm.allreduce(plain)
        plain.div_(n)

    def verify() -> int:
        y = make_input(comm.rank, x.numel())
        comm.allreduce(y)
        expected = sum(make_input(r, x.numel()).double() for r in range(n))
        return int((~torch.isclose(y.double(), expected, rtol=1e-5, atol=1e-5)).sum())

    return step, verify


def _pieces(args: argparse.Namespace, topo: compcoll.Topology, x: torch.Tensor) -> int:
    """``--pieces``, or ``compressed_allreduce``'s own rule (``pipeline.agree_pieces``) on the bench's node layout."""
    return args.pieces or (1 if topo.nodes == 1 else default_pieces(x))


def _one_piece(args: argparse.Namespace, topo: compcoll.Topology, x: torch.Tensor) -> int:
    return 1


def _onebit(pieces: Pieces) -> Build:
    """``compressed_allreduce`` with ``pieces(args, topo, input)`` pieces; verified from zero error buffers."""
    def build(comm: Communicator, topo: compcoll.Topology, x: torch.Tensor,
              args: argparse.Namespace) -> tuple[Step, Verify]:
        n, count = comm.size, x.numel()
        full = compcoll.padded_numel(count, n)
        worker, server, out = torch.zeros(full), torch.zeros(full // n), torch.empty_like(x)

        def step() -> None:
            compcoll.compressed_allreduce(x, worker, server, comm, protocol=args.protocol, out=out,
                                          pieces=pieces(args, topo, x))

        def verify() -> int:
            result = compcoll.compressed_allreduce(make_input(comm.rank, count), torch.zeros(full),
                                                   torch.zeros(full // n), comm, protocol=args.protocol,
                                                   pieces=pieces(args, topo, x))
            zeros_w, zeros_s = [np.zeros(full, np.float32)] * n, [np.zeros(full // n, np.float32)] * n
            return count_wrong(comm, result, lambda xs: reference.compressed_allreduce(
                xs, zeros_w, zeros_s, args.protocol)[0][comm.rank])

        return step, verify

    return build


def _pattern(rank: int, count: int) -> torch.Tensor:
    """``count`` bytes that only rank ``rank`` sends: (i + rank) mod 251."""
    return torch.arange(count, dtype=torch.int64).add_(rank).remainder_(251).to(torch.uint8)


def _wire(comm: Communicator, topo: compcoll.Topology, x: torch.Tensor,
          args: argparse.Namespace) -> tuple[Step, Verify]:
    """The transport operations of a one-piece ``1bit`` call on the same bytes, without a kernel.

    1. The agreement round with the scale (``spec.agreement_shares``): an all-gather of
       ``AGREEMENT_FIELDS`` float64s, or above ``GATHERED_AGREEMENT_RANKS`` an allreduce of
       ``SUMMED_AGREEMENT_FIELDS`` and an all-gather of one.
    2. gather_scatter: the all-to-all of the packed vector and the all-gather of the
       framed server chunks; allgather: the all-gather of the packed vector.
    Its time is the wire time of ``1bit``: ``1bit-serial``'s compute time beside it is the
    kernel time, and the pipelined ``1bit`` shows how much of the two overlapped.
    Verified: every block came from the rank it should.
    """
    n, rank = comm.size, comm.rank
    full = compcoll.padded_numel(x.numel(), n)
    summed = spec.summed_agreement(n)
    record = torch.zeros(spec.SUMMED_AGREEMENT_FIELDS if summed else spec.AGREEMENT_FIELDS, dtype=torch.float64)
    value, table = torch.zeros(1, dtype=torch.float64), torch.empty(n * record.numel(), dtype=torch.float64)
    packed, framed = full // 8, SCALE_BYTES + full // n // 8
    if args.protocol == "allgather":
        exchanges = [(comm.allgather, _pattern(rank, packed), n * packed, lambda r: _pattern(r, packed))]
    else:
        exchanges = [(comm.alltoall, _pattern(rank, packed), packed, lambda r: _pattern(r, packed).view(n, -1)[rank]),
                     (comm.allgather, _pattern(rank, framed), n * framed, lambda r: _pattern(r, framed))]
    received = [torch.empty(size, dtype=torch.uint8) for _, _, size, _ in exchanges]

    def step() -> None:
        if summed:
            comm.allreduce(record)
            comm.allgather(value, table[:n])
        else:
            comm.allgather(record, table)
        for (op, send, _, _), recv in zip(exchanges, received):
            op(send, recv)

    def verify() -> int:
        step()
        return sum(int((recv.view(n, -1)[r] != expect(r)).sum())
                   for (_, _, _, expect), recv in zip(exchanges, received) for r in range(n))

    return step, verify


def _hier(comm: Communicator, topo: compcoll.Topology, x: torch.Tensor,
          args: argparse.Namespace) -> tuple[Step, Verify]:
    """``hierarchical_allreduce`` (Birder); verified with seed 1, step 0."""
    k, out = topo.ranks_per_node, torch.empty_like(x)

    def verify() -> int:
        result = compcoll.hierarchical_allreduce(make_input(comm.rank, x.numel()), comm, ranks_per_node=k, seed=1,
                                                 step=0)
        simulate = ((lambda xs: reference.hierarchical_allreduce(xs, k, 1, 0)[0][comm.rank]) if _consecutive(topo)
                    else None)
        return count_wrong(comm, result, simulate)

    return lambda: compcoll.hierarchical_allreduce(x, comm, ranks_per_node=k, out=out), verify


def _hier_ef(comm: Communicator, topo: compcoll.Topology, x: torch.Tensor,
             args: argparse.Namespace) -> tuple[Step, Verify]:
    """``hierarchical_compressed_allreduce``; verified from zero error buffers."""
    n, k, count, out = comm.size, topo.ranks_per_node, x.numel(), torch.empty_like(x)
    wn, sn = compcoll.hierarchical_error_numels(count, n, k)
    worker, server = torch.zeros(wn), torch.zeros(sn)

    def verify() -> int:
        result = compcoll.hierarchical_compressed_allreduce(make_input(comm.rank, count), torch.zeros(wn),
                                                            torch.zeros(sn), comm, ranks_per_node=k)
        zeros_w, zeros_s = [np.zeros(wn, np.float32)] * n, [np.zeros(sn, np.float32)] * n
        simulate = ((lambda xs: reference.hierarchical_compressed_allreduce(xs, zeros_w, zeros_s, k)[0][comm.rank])
                    if _consecutive(topo) else None)
        return count_wrong(comm, result, simulate)

    return (lambda: compcoll.hierarchical_compressed_allreduce(x, worker, server, comm, ranks_per_node=k, out=out),
            verify)


def _peer(name: str) -> Build:
    """PyTorch's DDP hook ``name``: fp16 verified against the exact average (float16 tolerance),
    PowerSGD (a low-rank approximation by design) only across ranks."""
    def build(comm: Communicator, topo: compcoll.Topology, x: torch.Tensor,
              args: argparse.Namespace) -> tuple[Step, Verify]:
        step, result = ddp_hook_step(comm, x, name, args.powersgd_rank)

        def verify() -> int:
            out, wrong = result(), 0
            if name == "fp16":
                expected = sum(make_input(r, out.numel()).double() for r in range(comm.size)) / comm.size
                wrong = int((~torch.isclose(out.double(), expected, rtol=1e-2, atol=1e-2)).sum())
            return wrong + count_wrong(comm, out, None)

        return step, verify

    return build


METHODS: dict[str, Method] = {m.name: m for m in (
    Method("plain", "the communicator's allreduce, then / n", _plain),
    Method("1bit", "compressed_allreduce, in pieces that overlap the wire when large (--pieces)",
           _onebit(_pieces), pieces=_pieces),
    Method("1bit-serial", "compressed_allreduce in one piece", _onebit(_one_piece), pieces=_one_piece),
    Method("1bit-wire", "1bit's transport operations on the same bytes, no kernels (its wire time)", _wire),
    Method("hier", "hierarchical_allreduce (Birder)", _hier),
    Method("hier-ef", "hierarchical_compressed_allreduce", _hier_ef),
    *(Method(name, f"PyTorch's {name} DDP communication hook (Gloo)", _peer(name), counted=False,
             sent=lambda n, x, args, name=name: hook_bytes(name, n, x.numel(), args.powersgd_rank))
      for name in PEERS),
)}
