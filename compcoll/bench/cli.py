"""nccl-tests style benchmark: compressed vs plain allreduce on the same communicator.

Run it under a launcher (``mpiexec -n 4 python -m compcoll.bench``, ``torchrun
--nproc-per-node 4 -m compcoll.bench``) or let it start local ranks itself
(``python -m compcoll.bench --launch 4 --backend mpi``).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import zlib

import numpy as np
import torch

import compcoll
from compcoll.algorithms.onebit import PROTOCOLS
from compcoll.comm import Communicator
from compcoll.kernels import reference

_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
_REFERENCE_LIMIT = 1 << 20


def parse_size(text: str) -> int:
    """'64K', '16M', '1G' or a plain number of bytes."""
    text = text.strip().upper().removesuffix("B")
    unit = text[-1] if text and text[-1] in _UNITS else ""
    return int(float(text[: len(text) - len(unit)]) * _UNITS[unit])


def sizes(begin: int, end: int, factor: float) -> list[int]:
    """Message sizes in bytes from ``begin`` to ``end``, multiplying by ``factor`` (>= 4 bytes)."""
    out, size = [], max(4, begin)
    while size <= end:
        out.append(size // 4 * 4)
        size = int(size * factor) if factor > 1 else end + 1
    return out


def _max_over_ranks(comm: Communicator, value: float) -> float:
    table = torch.empty(comm.size, dtype=torch.float64)
    comm.allgather(torch.tensor([value], dtype=torch.float64), table)
    return float(table.max())


def _timed(comm: Communicator, step, iters: int, warmup: int, runs: int) -> float:
    """Median over ``runs`` of the per-iteration time (slowest rank) of ``iters`` calls."""
    for _ in range(warmup):
        step()
    times = []
    for _ in range(runs):
        comm.barrier()
        start = time.perf_counter()
        for _ in range(iters):
            step()
        times.append(_max_over_ranks(comm, (time.perf_counter() - start) / iters))
    return statistics.median(times)


def _input(rank: int, count: int) -> torch.Tensor:
    return torch.randn(count, generator=torch.Generator().manual_seed(12345 + rank))


def _verify_plain(comm: Communicator, count: int) -> int:
    """Elements of a plain allreduce that differ from the sum of all ranks' inputs."""
    x = _input(comm.rank, count)
    comm.allreduce(x)
    expected = sum(_input(r, count).double() for r in range(comm.size))
    return int((~torch.isclose(x.double(), expected, rtol=1e-5, atol=1e-5)).sum())


def _verify_compressed(comm: Communicator, count: int, protocol: str) -> int:
    """Wrong elements of one compressed call: vs the reference (small sizes) and across ranks."""
    full = compcoll.padded_numel(count, comm.size)
    out = compcoll.compressed_allreduce(
        _input(comm.rank, count), torch.zeros(full), torch.zeros(full // comm.size), comm, protocol=protocol
    )
    wrong = 0
    if count * comm.size <= _REFERENCE_LIMIT:
        zeros_w = [np.zeros(full, np.float32)] * comm.size
        zeros_s = [np.zeros(full // comm.size, np.float32)] * comm.size
        expected = reference.compressed_allreduce(
            [_input(r, count).numpy() for r in range(comm.size)], zeros_w, zeros_s, protocol
        )[0][comm.rank]
        wrong = int((out.numpy() != expected).sum())
    checksums = torch.empty(comm.size, dtype=torch.int64)
    comm.allgather(torch.tensor([zlib.crc32(out.numpy().tobytes())]), checksums)
    return wrong + int((checksums != checksums[0]).sum()) * count


def measure(comm: Communicator, size: int, args: argparse.Namespace) -> dict:
    """One row: plain and compressed allreduce of ``size`` bytes of float32, side by side."""
    n, count = comm.size, size // 4
    x = _input(comm.rank, count)
    plain = x.clone()

    def plain_step() -> None:
        plain.copy_(x)
        comm.allreduce(plain)
        plain.div_(n)

    full = compcoll.padded_numel(count, n)
    worker, server, out = torch.zeros(full), torch.zeros(full // n), torch.empty_like(x)

    def compressed_step() -> None:
        compcoll.compressed_allreduce(x, worker, server, comm, protocol=args.protocol, out=out)

    row = {"size": size, "count": count, "ranks": n}
    for name, step, verify in (
        ("plain", plain_step, lambda: _verify_plain(comm, count)),
        ("1bit", compressed_step, lambda: _verify_compressed(comm, count, args.protocol)),
    ):
        sent = comm.bytes_sent
        step()
        per_call = comm.bytes_sent - sent
        seconds = _timed(comm, step, args.iters, args.warmup, args.runs)
        algbw = size / seconds / 1e9
        row[name] = {
            "time_us": seconds * 1e6,
            "algbw_GBps": algbw,
            "busbw_GBps": algbw * 2 * (n - 1) / n,
            "bytes_sent": per_call,
            "wrong": verify() if args.check else None,
        }
    row["speedup"] = row["plain"]["time_us"] / row["1bit"]["time_us"]
    row["compression"] = row["plain"]["bytes_sent"] / row["1bit"]["bytes_sent"] if n > 1 else None
    return row


def _format_table(rows: list[dict], comm: Communicator, args: argparse.Namespace) -> str:
    head = (
        f"# compcoll.bench: {type(comm).__name__} {comm.size} rank(s), protocol {args.protocol}, "
        f"{args.iters} iters x {args.runs} runs (median), {args.warmup} warmup\n"
        f"# {'size(B)':>12} {'count':>11} | {'plain us':>10} {'algbw':>7} {'busbw':>7} {'sent(B)':>11} "
        f"{'wrong':>5} | {'1bit us':>10} {'algbw':>7} {'busbw':>7} {'sent(B)':>11} {'wrong':>5} | "
        f"{'speedup':>7} {'bytes x':>7}"
    )
    lines = [head]
    for r in rows:
        cells = [f"  {r['size']:>12} {r['count']:>11}"]
        for name in ("plain", "1bit"):
            m = r[name]
            wrong = "-" if m["wrong"] is None else str(m["wrong"])
            cells.append(
                f"{m['time_us']:>10.1f} {m['algbw_GBps']:>7.3f} {m['busbw_GBps']:>7.3f} "
                f"{m['bytes_sent']:>11.0f} {wrong:>5}"
            )
        ratio = "-" if r["compression"] is None else f"{r['compression']:.1f}"
        cells.append(f"{r['speedup']:>7.2f} {ratio:>7}")
        lines.append(" | ".join(cells))
    return "\n".join(lines)


def run_benchmark(comm: Communicator, args: argparse.Namespace) -> list[dict]:
    """Measure every size; rank 0 prints a line per size as it goes, then the table or JSON."""
    rows = []
    for size in sizes(args.begin, args.end, args.factor):
        rows.append(measure(comm, size, args))
        if comm.rank == 0 and not args.quiet:
            print(f"# measured {size} bytes", file=sys.stderr, flush=True)
    if comm.rank == 0:
        report = {"communicator": type(comm).__name__, "ranks": comm.size, "protocol": args.protocol,
                  "iters": args.iters, "runs": args.runs, "warmup": args.warmup, "rows": rows}
        if args.json:
            text = json.dumps(report, indent=1)
            if args.json == "-":
                print(text)
            else:
                with open(args.json, "w") as f:
                    f.write(text + "\n")
        if args.json != "-":
            print(_format_table(rows, comm, args), flush=True)
    return rows


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="compcoll-bench", description=__doc__.splitlines()[0])
    p.add_argument("-b", "--begin", type=parse_size, default=parse_size("64K"), help="smallest size in bytes (64K)")
    p.add_argument("-e", "--end", type=parse_size, default=parse_size("16M"), help="largest size in bytes (16M)")
    p.add_argument("-f", "--factor", type=float, default=4.0, help="size multiplier between rows (4)")
    p.add_argument("-n", "--iters", type=int, default=5, help="timed iterations per run (5)")
    p.add_argument("-r", "--runs", type=int, default=5, help="runs whose median is reported (5)")
    p.add_argument("-w", "--warmup", type=int, default=2, help="untimed iterations first (2)")
    p.add_argument("-c", "--check", type=int, default=1, help="verify results: 1 yes, 0 no (1)")
    p.add_argument("--protocol", choices=PROTOCOLS, default="gather_scatter")
    p.add_argument("--json", metavar="PATH", help="also write JSON to PATH ('-' prints only JSON)")
    p.add_argument("--launch", type=int, metavar="N", help="start N local ranks (no launcher needed)")
    p.add_argument("--backend", choices=("mpi", "gloo"), default="mpi", help="with --launch (mpi)")
    p.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    return p


def launched(comm: Communicator, argv: list[str]) -> None:
    """Rank body for ``--launch``: the benchmark on the communicator the harness built."""
    run_benchmark(comm, parser().parse_args(argv))


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
    args = parser().parse_args(argv)
    if args.launch:
        from compcoll.testing import run

        rest = _without(argv, ("--launch", "--backend"))
        print(run("compcoll.bench.cli:launched", args.launch, args.backend, args=(rest + ["--quiet"],),
                  timeout=3600).strip())
        return
    run_benchmark(compcoll.init(), args)
