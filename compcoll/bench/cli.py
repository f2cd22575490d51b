"""nccl-tests style benchmark: compressed, hierarchical and plain allreduce on the same communicator.

Methods (``methods.METHODS``): ``plain`` (the communicator's allreduce, then / n), ``1bit``
(``compressed_allreduce``, in pieces that overlap the wire when the tensor is large),
``1bit-serial`` (the same in one piece), ``1bit-wire`` (its transport operations alone, no
kernels), ``hier`` (``hierarchical_allreduce``), ``hier-ef``
(``hierarchical_compressed_allreduce``), and the peers users would pick instead,
PyTorch's DDP communication hooks ``fp16`` and ``powersgd`` on the same Gloo group. Every
row splits the bytes sent into intra-node and inter-node traffic, from the node
layout (``--ranks-per-node`` or hostnames), with ``--nic`` counts what the network
interface itself sent, and splits the time into compute and waiting for the wire.

Run it under a launcher (``mpiexec -n 4 python -m compcoll.bench``, ``torchrun
--nproc-per-node 4 -m compcoll.bench``) or let it start local ranks itself
(``python -m compcoll.bench --launch 4 --backend mpi``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from typing import Callable

import torch

import compcoll
from compcoll.comm import Communicator
from compcoll.spec import PROTOCOLS

from .arguments import above, at_least, parse_size
from .methods import METHODS, make_input

NIC_CALLS = 4
"""Untimed calls a method's interface bytes are counted over (``--nic``), then divided: a call's own count also took
in stray packets sent in its window (a 1-bit call of 256 KiB over Gloo: 9.6-10.0 KB in 11 runs, 10.8 KB in a run
beside a loaded test session), which a count over several calls spreads."""


def sizes(begin: int, end: int, factor: float) -> list[int]:
    """Message sizes in bytes from ``begin`` to ``end``, multiplying by ``factor`` (>= 4 bytes)."""
    out, size = [], max(4, begin)
    while size <= end:
        out.append(size // 4 * 4)
        size = int(size * factor) if factor > 1 else end + 1
    return out


def _method_list(text: str) -> list[str]:
    """'plain,1bit,hier' -> the listed methods, each known and given once."""
    names = [t.strip() for t in text.split(",") if t.strip()]
    unknown = [t for t in names if t not in METHODS]
    if unknown or not names or len(set(names)) != len(names):
        raise argparse.ArgumentTypeError(f"methods must be distinct names from {', '.join(METHODS)}; got {text!r}")
    return names


def _max_over_ranks(comm: Communicator, *values: float) -> list[float]:
    """Each of ``values``' maximum over the ranks."""
    table = torch.empty(comm.size * len(values), dtype=torch.float64)
    comm.allgather(torch.tensor(values, dtype=torch.float64), table)
    return table.view(comm.size, -1).max(dim=0).values.tolist()


def _timed(comm: Communicator, step: Callable[[], object], iters: int, warmup: int, runs: int) -> tuple[float, float]:
    """Medians over ``runs`` of the per-iteration time (slowest rank) and compute time of ``iters`` calls.

    A rank's compute time is its time less what it spent blocked on the communicator's
    transport operations (``wait_seconds``); the largest over the ranks is kept.
    """
    for _ in range(warmup):
        step()
    times, computes = [], []
    for _ in range(runs):
        comm.barrier()
        waited, start = comm.wait_seconds, time.perf_counter()
        for _ in range(iters):
            step()
        elapsed = (time.perf_counter() - start) / iters
        slowest, compute = _max_over_ranks(comm, elapsed, elapsed - (comm.wait_seconds - waited) / iters)
        times.append(slowest)
        computes.append(compute)
    return statistics.median(times), statistics.median(computes)


def _nic_tx(nic: str | None) -> int:
    """Bytes ``nic`` has sent so far (0 without one): the link traffic every method is charged."""
    if nic is None:
        return 0
    with open(f"/sys/class/net/{nic}/statistics/tx_bytes") as f:
        return int(f.read())


def _spread(sent: int | None, comm: Communicator, topo: compcoll.Topology) -> tuple[int | None, int | None]:
    """(intra, inter) of ``sent`` bytes spread evenly over the other ranks, as the communicator counts an allreduce."""
    if sent is None or comm.size == 1:
        return (None, None) if sent is None else (sent, 0)
    mine = topo.node_of[comm.rank]
    neighbours = sum(1 for r, node in enumerate(topo.node_of) if node == mine and r != comm.rank)
    intra = sent * neighbours // (comm.size - 1)
    return intra, sent - intra


def measure(comm: Communicator, topo: compcoll.Topology, size: int, args: argparse.Namespace,
            progress: Callable[[str], None] = lambda _: None) -> dict:
    """One size: every method of ``args.methods`` on ``size`` bytes of float32, side by side.

    1. Untimed calls of each method (one; ``NIC_CALLS`` with ``args.nic``) count its bytes per call (all,
       intra-node, inter-node; the peers' DDP traffic bypasses the communicator, so theirs come from
       ``Method.sent``, spread over the peers as an allreduce's are) and, with ``args.nic``, what that
       interface sent (max over ranks).
    2. The timed runs (median of per-iteration times of the slowest rank).
    3. One verified call per method, when ``args.check``.
    Speedup and byte ratios are relative to the first method (plain allreduce by default).
    """
    n, count = comm.size, size // 4
    x = make_input(comm.rank, count)
    row: dict = {"size": size, "count": count, "ranks": n, "ranks_per_node": topo.ranks_per_node}
    calls = NIC_CALLS if args.nic else 1
    for name in args.methods:
        method = METHODS[name]
        step, verify = method.build(comm, topo, x, args)
        sent, (intra, inter), nic = comm.bytes_sent, topo.traffic(comm), _nic_tx(args.nic)
        for _ in range(calls):
            step()
        nic = (_nic_tx(args.nic) - nic) / calls
        sent, (intra, inter) = ((comm.bytes_sent - sent) // calls,
                                ((a - b) // calls for a, b in zip(topo.traffic(comm), (intra, inter))))
        (nic,) = _max_over_ranks(comm, nic)
        seconds, compute = _timed(comm, step, args.iters, args.warmup, args.runs)
        algbw = size / seconds / 1e9
        if not method.counted:
            sent = method.sent(n, x, args) if method.sent else None
            intra, inter = _spread(sent, comm, topo)
        row[name] = {
            "time_us": seconds * 1e6,
            "compute_us": compute * 1e6 if method.counted else None,
            "pieces": method.pieces(args, topo, x) if method.pieces else None,
            "algbw_GBps": algbw,
            "busbw_GBps": algbw * 2 * (n - 1) / n,
            "bytes_sent": sent,
            "intra_bytes": intra,
            "inter_bytes": inter,
            "nic_tx_bytes": int(nic) if args.nic else None,
            "wrong": verify() if args.check else None,
        }
        progress(f"{size} B {name}: {seconds * 1e3:.2f} ms")
    base = row[args.methods[0]]
    for name in args.methods:
        m = row[name]
        m["speedup"] = base["time_us"] / m["time_us"]
        for key, ratio in (("bytes_sent", "bytes_ratio"), ("inter_bytes", "inter_ratio"),
                           ("nic_tx_bytes", "nic_ratio")):
            m[ratio] = base[key] / m[key] if m[key] and base[key] else None
    return row


def _cell(value: float | int | None, width: int, spec: str = "") -> str:
    """``value`` formatted with ``spec``, or '-' for None, right-aligned in ``width``."""
    return f"{'-' if value is None else format(value, spec):>{width}}"


def _format_table(rows: list[dict], comm: Communicator, args: argparse.Namespace, latency: float) -> str:
    first = rows[0] if rows else {"ranks_per_node": "?"}
    head = (
        f"# compcoll.bench: {type(comm).__name__} {comm.size} rank(s), {first['ranks_per_node']} per node, "
        f"protocol {args.protocol}, {args.iters} iters x {args.runs} runs (median), {args.warmup} warmup; "
        f"latency (4-byte allreduce) {latency * 1e6:.1f} us; "
        f"ratios vs {args.methods[0]}"
        + (f"; nic(B): max bytes one rank's {args.nic} sent per call" if args.nic else "")
        + f"\n# {'size(B)':>12} {'count':>11} {'method':>11} | {'time us':>10} {'compute us':>10} {'algbw':>7} "
        f"{'busbw':>7} | "
        f"{'sent(B)':>11} {'intra(B)':>11} {'inter(B)':>11} {'nic(B)':>11} {'wrong':>5} | {'speedup':>7} "
        f"{'bytes x':>7} {'inter x':>7} {'nic x':>7}"
    )
    lines = [head]
    for r in rows:
        for name in args.methods:
            m = r[name]
            lines.append(
                f"  {r['size']:>12} {r['count']:>11} {name:>11} | {m['time_us']:>10.1f} "
                f"{_cell(m['compute_us'], 10, '.1f')} {m['algbw_GBps']:>7.3f} "
                f"{m['busbw_GBps']:>7.3f} | {_cell(m['bytes_sent'], 11)} {_cell(m['intra_bytes'], 11)} "
                f"{_cell(m['inter_bytes'], 11)} {_cell(m['nic_tx_bytes'], 11)} {_cell(m['wrong'], 5)} | "
                f"{m['speedup']:>7.2f} {_cell(m['bytes_ratio'], 7, '.1f')} {_cell(m['inter_ratio'], 7, '.1f')} "
                f"{_cell(m['nic_ratio'], 7, '.1f')}"
            )
    return "\n".join(lines)


def run_benchmark(comm: Communicator, args: argparse.Namespace) -> list[dict]:
    """Measure a 4-byte allreduce (the latency), then every size; rank 0 prints a progress line per method and size
    on stderr as it goes (or ``args.progress``; none with ``args.quiet``), then the table or JSON."""
    topo = compcoll.topology(comm, args.ranks_per_node)
    rows, todo, start = [], sizes(args.begin, args.end, args.factor), time.perf_counter()

    def progress(what: str) -> None:
        if comm.rank != 0 or args.quiet:
            return
        line = f"# [{len(rows) + 1}/{len(todo)} sizes, {time.perf_counter() - start:.0f} s] {what}\n"
        if args.progress:
            with open(args.progress, "a") as f:
                f.write(line)
        else:
            sys.stderr.write(line)
            sys.stderr.flush()

    tiny = torch.ones(1)
    latency, _ = _timed(comm, lambda: comm.allreduce(tiny), 10, 2, 5)
    for size in todo:
        rows.append(measure(comm, topo, size, args, progress))
    if comm.rank == 0:
        report = {"communicator": type(comm).__name__, "ranks": comm.size, "ranks_per_node": topo.ranks_per_node,
                  "methods": args.methods, "protocol": args.protocol, "iters": args.iters, "runs": args.runs,
                  "warmup": args.warmup, "latency_us": latency * 1e6, "nic": args.nic,
                  "powersgd_rank": args.powersgd_rank, "rows": rows}
        if args.json:
            text = json.dumps(report, indent=1)
            if args.json == "-":
                print(text)
            else:
                with open(args.json, "w") as f:
                    f.write(text + "\n")
        if args.json != "-":
            print(_format_table(rows, comm, args, latency), flush=True)
    return rows


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="compcoll-bench", description=__doc__.splitlines()[0],
        epilog="compcoll-bench model [...]: predict plain and 1-bit allreduce on any cluster with the alpha-beta "
               "model, calibrate its kernel rates, validate it (compcoll-bench model --help)",
    )
    p.add_argument("-b", "--begin", type=at_least(0, parse_size, "size"), default=parse_size("64K"),
                   help="smallest size in bytes (64K)")
    p.add_argument("-e", "--end", type=at_least(4, parse_size, "size"), default=parse_size("16M"),
                   help="largest size in bytes (16M)")
    p.add_argument("-f", "--factor", type=above(1), default=4.0, help="size multiplier between rows (4)")
    p.add_argument("-n", "--iters", type=at_least(1), default=5, help="timed iterations per run (5)")
    p.add_argument("-r", "--runs", type=at_least(1), default=5, help="runs whose median is reported (5)")
    p.add_argument("-w", "--warmup", type=at_least(0), default=2, help="untimed iterations first (2)")
    p.add_argument("-c", "--check", type=int, choices=(0, 1), default=1, help="verify results: 1 yes, 0 no (1)")
    p.add_argument("--protocol", choices=PROTOCOLS, default="gather_scatter", help="of the 1bit method")
    p.add_argument("--pieces", type=at_least(1), metavar="P",
                   help="pieces of the 1bit method (default: compressed_allreduce's choice by size, device and node "
                        "layout)")
    p.add_argument("--methods", type=_method_list, default=["plain", "1bit"],
                   help="comma-separated, side by side, the first is the baseline (plain,1bit): "
                        + "; ".join(f"{m.name}: {m.summary}" for m in METHODS.values()))
    p.add_argument("--ranks-per-node", type=at_least(1), metavar="K",
                   help="k consecutive ranks form a node (default: by hostname, or COMPCOLL_RANKS_PER_NODE)")
    p.add_argument("--nic", metavar="IFACE",
                   help="also count what network interface IFACE sends per call (/sys/class/net), max over ranks")
    p.add_argument("--powersgd-rank", type=at_least(1), default=1, metavar="R",
                   help="matrix_approximation_rank of the powersgd method (1, PyTorch's default)")
    p.add_argument("--json", metavar="PATH", help="also write JSON to PATH ('-' prints only JSON)")
    p.add_argument("--launch", type=at_least(1), metavar="N",
                   help="start N local ranks (no launcher needed); rank 0's progress lines come to this stderr")
    p.add_argument("--backend", choices=("mpi", "gloo"), default="mpi", help="with --launch (mpi)")
    p.add_argument("--quiet", action="store_true", help="no progress lines")
    p.add_argument("--progress", metavar="PATH", help="append progress lines to PATH instead of stderr")
    return p


def parse(argv: list[str]) -> argparse.Namespace:
    """The options, each checked by its type (``arguments``), and ``--begin`` no larger than ``--end``: argparse's
    usage error otherwise (status 2)."""
    p = parser()
    args = p.parse_args(argv)
    if args.begin > args.end:
        p.error(f"--begin ({args.begin} B) is larger than --end ({args.end} B)")
    return args


def launched(comm: Communicator, argv: list[str]) -> None:
    """Rank body for ``--launch``: the benchmark on the communicator the harness built."""
    run_benchmark(comm, parse(argv))


def _without(argv: list[str], options: tuple[str, ...]) -> list[str]:
    """``argv`` less the given options and their values (``--opt v`` and ``--opt=v``)."""
    out, skip = [], False
    for a in argv:
        if skip:
            skip = False
        elif a in options:
            skip = True
        elif not a.startswith(tuple(o + "=" for o in options)):
            out.append(a)
    return out


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["model"]:
        from .model_cli import main as model_main

        model_main(argv[1:])
        return
    args = parse(argv)
    if args.launch:
        from compcoll.launcher import run

        rest = _without(argv, ("--launch", "--backend"))
        if not args.progress and not args.quiet:
            rest += ["--progress", f"/proc/{os.getpid()}/fd/2"]
        print(run("compcoll.bench.cli:launched", args.launch, args.backend, args=(rest,), timeout=3600).strip())
        return
    run_benchmark(compcoll.init(), args)
