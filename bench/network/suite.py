"""The network benchmark suite: every scenario of link rate x node layout, Gloo and MPI, then the plots (root only).

Usage (as root, from the repository root):
    .venv/bin/python bench/network/suite.py --rates 1gbit,10gbit --layouts 2x1,2x2 --out bench/results/network

1. For each rate and layout (nodes x ranks per node), one Gloo job runs plain Gloo
   allreduce, compcoll's flat 1-bit (its wire alone, in one piece and pipelined, so that
   ``overlap.py`` can split it), hierarchical 1-bit (layouts with more than one rank
   per node) and PyTorch's fp16 and PowerSGD DDP hooks side by side on one group; one MPI
   job runs plain MPI_Allreduce, flat and hierarchical 1-bit side by side (``scenario.py``).
   On the idle machine, before and after the jobs, the kernel rates are calibrated at
   the jobs' threads per rank (``compcoll.bench model --calibrate``); OUT/kernels.json
   keeps the faster of the two for each method, so that a passing load on the machine
   during one of them does not skew the model (both are kept beside it).
2. Each job's table and JSON go to OUT/<backend>_<rate>_<N>x<k>.{txt,json}, with the
   command that made them, as soon as it ends; a progress line per job on stderr.
3. The model is validated against every job (OUT/model_validation.{txt,json}), and
   ``plot.py`` draws OUT/time_vs_size.png and OUT/speedup_vs_bandwidth.png.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import time
from pathlib import Path

from plot import plot_directory
from scenario import bench_args, default_threads, parse, run_scenario, write

from compcoll.bench.model_cli import calibrate, validate

GLOO_METHODS = ("plain", "1bit-wire", "1bit-serial", "1bit", "hier", "fp16", "powersgd")
MPI_METHODS = ("plain", "1bit-wire", "1bit-serial", "1bit", "hier")
CALIBRATION_SIZE = 64 << 20
VALIDATION_MIN_SIZE = 1 << 20


def layouts(text: str) -> list[tuple[int, int]]:
    """'2x1,2x2' -> [(2, 1), (2, 2)]."""
    return [tuple(int(v) for v in item.split("x")) for item in text.split(",")]


def methods_for(backend: str, ranks_per_node: int) -> str:
    """The side-by-side methods of one job: hierarchical only where a node has several ranks."""
    names = GLOO_METHODS if backend == "gloo" else MPI_METHODS
    return ",".join(m for m in names if m != "hier" or ranks_per_node > 1)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rates", default="1gbit,10gbit")
    p.add_argument("--layouts", type=layouts, default=layouts("2x1,2x2"))
    p.add_argument("--backends", default="gloo,mpi")
    p.add_argument("--out", type=Path, default=Path("bench/results/network"))
    args = parse(p, "")
    args.out.mkdir(parents=True, exist_ok=True)
    threads = sorted({default_threads(nodes * k) for nodes, k in args.layouts})
    before = {str(t): calibrate(t, CALIBRATION_SIZE) for t in threads}
    jobs = [(rate, nodes, k, backend) for rate in args.rates.split(",") for nodes, k in args.layouts
            for backend in args.backends.split(",")]
    start, command = time.perf_counter(), shlex.join([sys.executable, *sys.argv])
    for i, (rate, nodes, k, backend) in enumerate(jobs):
        print(f"# [{i + 1}/{len(jobs)} jobs, {time.perf_counter() - start:.0f} s] {backend} {rate} {nodes}x{k}",
              file=sys.stderr, flush=True)
        methods = args.methods or methods_for(backend, k)
        table, report = run_scenario(rate, nodes, k, backend, bench_args(args, methods),
                                     default_threads(nodes * k), args.timeout)
        report["command"] = command
        write(args.out / f"{backend}_{rate}_{nodes}x{k}", command, table, report)
        print(table, flush=True)
    after = {str(t): calibrate(t, CALIBRATION_SIZE) for t in threads}
    kernels = {t: {m: max(rate, after[t][m]) for m, rate in rates.items()} for t, rates in before.items()}
    (args.out / "kernels.json").write_text(json.dumps({**kernels, "before": before, "after": after}, indent=1) + "\n")
    text, summary = validate(args.out, VALIDATION_MIN_SIZE)
    (args.out / "model_validation.txt").write_text(f"# {command}\n{text}\n")
    (args.out / "model_validation.json").write_text(json.dumps(summary, indent=1) + "\n")
    print(text, flush=True)
    for path in plot_directory(args.out):
        print(f"# wrote {path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
