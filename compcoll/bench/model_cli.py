"""``python -m compcoll.bench model``: calibrate kernel rates, validate the model on emulated runs, predict clusters."""

from __future__ import annotations

import argparse
import json
import math
import shlex
import statistics
import sys
import time
from pathlib import Path

import torch

import compcoll
from compcoll.comm.single import SingleComm

from .arguments import above, at_least, listed, parse_count, parse_size
from .model import MODEL_METHODS, Cluster, break_even_gbit, break_even_size, predict

EMULATED_INTRA_GBYTE = 2.0
MODELLED = {"1bit-serial": "1bit"}
"""Benchmark methods the model predicts under another method's name."""


def calibrate(threads: int, size: int, runs: int = 7) -> dict[str, float]:
    """GB/s of float32 input one rank's kernels process, per method, on ``threads`` threads.

    1. ``1bit`` and ``hier``: the collective on a 1-rank communicator, where every codec
       step runs and the exchanges are copies (median of ``runs``, after one warmup).
    2. ``plain``: the reduction's adds, ``out += other`` over the tensor.
    """
    import numba

    numba.set_num_threads(min(threads, numba.config.NUMBA_NUM_THREADS))
    torch.set_num_threads(threads)
    comm, count = SingleComm(), size // 4
    x, other = torch.randn(count), torch.randn(count)
    out = x.clone()
    worker, server = torch.zeros(compcoll.padded_numel(count, 1)), torch.zeros(compcoll.padded_numel(count, 1))
    steps = {
        "plain": lambda: out.add_(other),
        "1bit": lambda: compcoll.compressed_allreduce(x, worker, server, comm, out=out, pieces=1),
        "hier": lambda: compcoll.hierarchical_allreduce(x, comm, ranks_per_node=1, out=out),
    }
    rates = {}
    for name, step in steps.items():
        step()
        times = []
        for _ in range(runs):
            start = time.perf_counter()
            step()
            times.append(time.perf_counter() - start)
        rates[name] = size / statistics.median(times) / 1e9
    return rates


def emulated_cluster(report: dict, kernels: dict) -> Cluster:
    """The Cluster of one emulated scenario: its measured goodput and latency, kernel rates
    calibrated at its threads per rank and scaled by the share of the machine's cores
    each rank gets when all of them compute at once."""
    ranks, threads = report["ranks"], report["threads_per_rank"]
    share = min(1.0, report["cpu_count"] / (ranks * threads))
    rates = kernels[str(threads)]
    return Cluster(nodes=report["nodes"], ranks_per_node=report["ranks_per_node"],
                   inter_gbit=report["link_goodput_gbit"], latency_us=report["latency_us"],
                   intra_gbyte=EMULATED_INTRA_GBYTE, kernel_gbyte={m: r * share for m, r in rates.items()})


def validate(directory: Path, min_size: int) -> tuple[str, dict]:
    """Model vs measurement for every modelled method of every report in ``directory``.

    1. Read ``kernels.json`` (from ``--calibrate``) and every ``<backend>_<rate>_<N>x<k>.json``.
    2. For each row and method, predict with ``emulated_cluster`` (``1bit-serial`` is 1bit
       in one piece; a row's ``pieces``, where recorded, are the pieces its call overlapped
       in) and record the relative error (predicted / measured - 1).
    3. Summarise |error| (median, max) over sizes >= ``min_size``: per backend, per backend
       and method, and overall.
    """
    kernels = json.loads((directory / "kernels.json").read_text())
    lines = [f"# model vs measured, relative error = predicted / measured - 1; summary over sizes >= {min_size} B",
             f"# {'scenario':>24} {'size(B)':>11} {'method':>11} | {'measured ms':>11} {'model ms':>9} {'error':>7} | "
             f"{'kernels':>8} {'wire':>8} {'latency':>8}"]
    errors: dict[str, list[float]] = {}
    for path in sorted(directory.glob("*_*_*x*.json")):
        report = json.loads(path.read_text())
        cluster = emulated_cluster(report, kernels)
        for row in report["rows"]:
            for method in (m for m in report["methods"] if MODELLED.get(m, m) in MODEL_METHODS):
                pieces = row[method].get("pieces") or 1
                guess = predict(cluster, row["size"], MODELLED.get(method, method), pieces)
                seen = row[method]["time_us"] * 1e-6
                error = guess.total / seen - 1
                if row["size"] >= min_size:
                    for key in (report["backend"], f"{report['backend']} {method}"):
                        errors.setdefault(key, []).append(abs(error))
                lines.append(
                    f"  {path.stem:>24} {row['size']:>11} {method:>11} | {seen * 1e3:>11.2f} {guess.total * 1e3:>9.2f} "
                    f"{error:>+7.1%} | {guess.kernels * 1e3:>8.2f} {guess.wire * 1e3:>8.2f} "
                    f"{guess.latency * 1e3:>8.2f}"
                )
    summary = {b: {"median": statistics.median(e), "max": max(e), "points": len(e)} for b, e in errors.items()}
    everything = [e for key, values in errors.items() if " " not in key for e in values]
    summary["all"] = {"median": statistics.median(everything), "max": max(everything), "points": len(everything)}
    for name, s in summary.items():
        lines.append(f"# {name}: |error| median {s['median']:.1%}, max {s['max']:.1%} over {s['points']} points")
    return "\n".join(lines), {"min_size": min_size, "kernels": kernels, "summary": summary}


def _amount(value: float, unit: float) -> str:
    """``value / unit`` in a 6-wide cell; 'never' for inf."""
    return f"{'never' if math.isinf(value) else f'{value / unit:.0f}':>6}"


def format_count(count: int) -> str:
    """A parameter count the way ``--params`` takes it: 10, 300M, 1.3B."""
    for suffix, scale in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if count >= scale:
            return f"{count / scale:.3g}{suffix}"
    return str(count)


def kernel_rates(args: argparse.Namespace) -> dict[str, float]:
    """The kernel rates of the predictions: ``--kernels FILE`` (from ``--calibrate``, at ``--threads``), else
    ``--kernel-gbyte`` for both 1-bit methods and ``--reduce-gbyte`` for plain's reduction."""
    if args.kernels is None:
        return {"plain": args.reduce_gbyte, "1bit": args.kernel_gbyte, "hier": args.kernel_gbyte}
    calibrated = json.loads(args.kernels.read_text())
    if str(args.threads) not in calibrated:
        raise SystemExit(f"{args.kernels} holds rates for {sorted(k for k in calibrated if k.isdigit())} thread(s), "
                         f"not --threads {args.threads}")
    return calibrated[str(args.threads)]


def predictions(args: argparse.Namespace) -> str:
    """The table of predicted allreduce times per step for every cluster and model size asked."""
    kernels = kernel_rates(args)
    lines = [
        f"# predicted allreduce of a float32 gradient per step; {args.ranks_per_node} ranks per node, "
        f"alpha {args.latency_us:g} us, intra {args.intra_gbyte:g} GB/s, kernels (GB/s of input) "
        f"{', '.join(f'{m} {r:.3g}' for m, r in kernels.items())}; '-': one node, no link to pay for",
        f"# {'nodes':>5} {'Gbit':>5} {'params':>7} | {'plain ms':>9} {'1bit ms':>8} {'hier ms':>8} | "
        f"{'1bit x':>6} {'hier x':>6} | pays below Gbit/s: {'1bit':>6} {'hier':>6} | pays from KiB: {'1bit':>6} "
        f"{'hier':>6}",
    ]
    for nodes in args.nodes:
        for gbit in args.gbit:
            cluster = Cluster(nodes, args.ranks_per_node, gbit, args.latency_us, args.intra_gbyte, kernels)
            for params in args.params:
                size = 4 * params
                t = {m: predict(cluster, size, m).total for m in MODEL_METHODS}
                gbits = " ".join(_amount(break_even_gbit(cluster, size, m), 1) if nodes > 1 else f"{'-':>6}"
                                 for m in ("1bit", "hier"))
                sizes = " ".join(_amount(break_even_size(cluster, m), 1024) for m in ("1bit", "hier"))
                lines.append(
                    f"  {nodes:>5} {gbit:>5g} {format_count(params):>7} | "
                    f"{t['plain'] * 1e3:>9.1f} {t['1bit'] * 1e3:>8.1f} "
                    f"{t['hier'] * 1e3:>8.1f} | {t['plain'] / t['1bit']:>6.1f} {t['plain'] / t['hier']:>6.1f} | "
                    f"{'':>18} {gbits} | {'':>14} {sizes}"
                )
    return "\n".join(lines)


VERDICT_BUCKET = 25 * 10**6
"""The verdict's bucket: 25 MB of float32, DDP's default bucket size."""


def verdict(kernels: dict[str, float], latency_us: float, intra_gbyte: float) -> str:
    """Whether 1-bit pays, from measured kernel rates: one line per cluster of 2 and 16 nodes (one rank each) on 1, 10
    and 100 Gbit/s links, for one ``VERDICT_BUCKET`` bucket.

    1. Predict plain and flat 1-bit allreduce of the bucket (``predict``) on each cluster.
    2. Say the speed-up (plain's time / 1-bit's), and the link rate above which plain wins
       (``break_even_gbit``): where compression stops paying.
    """
    lines = [f"# verdict for a {VERDICT_BUCKET / 1e6:g} MB bucket, one rank per node, from this machine's kernel "
             f"rates (GB/s of input: {', '.join(f'{m} {r:.3g}' for m, r in kernels.items())}), alpha "
             f"{latency_us:g} us"]
    for nodes in (2, 16):
        for gbit in (1.0, 10.0, 100.0):
            cluster = Cluster(nodes, 1, gbit, latency_us, intra_gbyte, kernels)
            plain, onebit = (predict(cluster, VERDICT_BUCKET, m).total for m in ("plain", "1bit"))
            even = break_even_gbit(cluster, VERDICT_BUCKET, "1bit")
            pays = "at any rate" if math.isinf(even) else f"below {even:.3g} Gbit/s"
            lines.append(f"{nodes:>2} nodes, {gbit:>3g} Gbit/s: plain {plain * 1e3:7.1f} ms, 1-bit {onebit * 1e3:7.1f} "
                         f"ms: {plain / onebit:5.2f}x {'faster' if onebit < plain else 'slower'} (1-bit pays {pays})")
    return "\n".join(lines)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="compcoll-bench model", description=__doc__.splitlines()[0])
    p.add_argument("--calibrate", type=Path, metavar="JSON",
                   help="measure the kernel rates here (at --threads) and add them to JSON")
    p.add_argument("--threads", type=at_least(1), default=1,
                   help="threads for --calibrate, and the entry --kernels reads (1)")
    p.add_argument("--size", type=at_least(4, parse_size, "size"), default=parse_size("64M"),
                   help="tensor for --calibrate (64M)")
    p.add_argument("--verdict", action="store_true",
                   help="measure the kernel rates (at --threads, on a 25 MB bucket) and say whether 1-bit pays on "
                        "2 and 16 nodes at 1, 10 and 100 Gbit/s")
    p.add_argument("--validate", type=Path, metavar="DIR",
                   help="compare with the suite's reports in DIR (needs DIR/kernels.json); writes "
                        "DIR/model_validation.{txt,json}")
    p.add_argument("--min-size", type=at_least(0, parse_size, "size"), default=parse_size("1M"),
                   help="smallest size in the --validate summary (1M)")
    p.add_argument("--nodes", type=listed(at_least(1)), default=[16, 32, 64, 128],
                   help="comma-separated node counts to predict (16,32,64,128)")
    p.add_argument("--ranks-per-node", type=at_least(1), default=8, help="ranks (GPUs) per node (8)")
    p.add_argument("--gbit", type=listed(above(0)), default=[10.0, 25.0, 100.0],
                   help="inter-node goodput per node, Gbit/s (10,25,100)")
    p.add_argument("--params", type=listed(at_least(1, parse_count, "count")),
                   default=[parse_count(v) for v in ("300M", "1.3B", "7B")],
                   help="comma-separated model sizes in parameters, float32 gradients (300M,1.3B,7B)")
    p.add_argument("--kernels", type=Path, metavar="JSON",
                   help="kernel rates from --calibrate (its --threads entry) instead of --kernel-gbyte / "
                        "--reduce-gbyte")
    p.add_argument("--latency-us", type=at_least(0, float, "number"), default=50.0, help="alpha, one collective (50)")
    p.add_argument("--intra-gbyte", type=above(0), default=100.0, help="per-rank intra-node GB/s (100, NVLink-class)")
    p.add_argument("--kernel-gbyte", type=above(0), default=200.0,
                   help="GB/s of input the 1-bit kernels process per rank (200: an assumed GPU rate; "
                        "measure yours with --calibrate on the ranks' device)")
    p.add_argument("--reduce-gbyte", type=above(0), default=1000.0, help="GB/s plain's reduction sums at (1000)")
    return p


def main(argv: list[str]) -> None:
    args = parser().parse_args(argv)
    if args.calibrate:
        known = json.loads(args.calibrate.read_text()) if args.calibrate.exists() else {}
        known[str(args.threads)] = calibrate(args.threads, args.size)
        args.calibrate.write_text(json.dumps(known, indent=1) + "\n")
        print(f"# kernel rates (GB/s of float32 input, {args.threads} thread(s)): {known[str(args.threads)]}")
        return
    if args.verdict:
        print(verdict(calibrate(args.threads, VERDICT_BUCKET), args.latency_us, args.intra_gbyte))
        return
    if args.validate:
        text, summary = validate(args.validate, args.min_size)
        command = shlex.join([sys.executable, "-m", "compcoll.bench", "model", *argv])
        (args.validate / "model_validation.txt").write_text(f"# {command}\n{text}\n")
        (args.validate / "model_validation.json").write_text(json.dumps(summary, indent=1) + "\n")
        print(text)
        return
    print(predictions(args))
