"""Flat vs hierarchical 1-bit allreduce across emulated nodes joined by a shaped link (root only).

Usage (as root, from the repository root):
    .venv/bin/python bench/network/hierarchical.py --rate 1gbit --nodes 2 --ranks-per-node 2 \
        -b 1M -e 64M --out bench/results/hierarchical_1gbit_2x2

1. Build ``--nodes`` network namespaces on a bridge, every link shaped to ``--rate``.
2. Measure the link's TCP goodput between node 0 and node 1.
3. Run ``compcoll.bench`` on Gloo or MPI (``--backend``) with ``--ranks-per-node`` ranks
   in each namespace (consecutive ranks per node), methods plain, 1bit, hier and hier-ef
   side by side.
4. Write the table (.txt) and JSON (.json, with the link rate and the command), then
   delete the namespaces.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import tempfile
from pathlib import Path

from netns import emulated_nodes, link_rate_gbit, why_unavailable

from compcoll.testing import run


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rate", default="1gbit", help="tc tbf rate of every link (1gbit)")
    p.add_argument("--nodes", type=int, default=2)
    p.add_argument("--ranks-per-node", type=int, default=2)
    p.add_argument("-b", "--begin", default="1M")
    p.add_argument("-e", "--end", default="64M")
    p.add_argument("-f", "--factor", default="4")
    p.add_argument("-n", "--iters", default="3")
    p.add_argument("-r", "--runs", default="5")
    p.add_argument("--methods", default="plain,1bit,hier,hier-ef")
    p.add_argument("--backend", choices=("gloo", "mpi"), default="gloo",
                   help="Gloo process group, or MPICH over TCP (shared memory and UCX's local transports off)")
    p.add_argument("--out", type=Path, help="write OUT.txt and OUT.json")
    p.add_argument("--timeout", type=float, default=3000.0, help="seconds for the whole run (3000)")
    args = p.parse_args()
    reason = why_unavailable()
    if reason:
        print(f"cannot emulate nodes here: {reason}", file=sys.stderr)
        return 2
    k = args.ranks_per_node
    with tempfile.TemporaryDirectory() as tmp, emulated_nodes(args.nodes, args.rate) as nodes:
        link = link_rate_gbit(nodes[0], nodes[1])
        print(f"# link {args.rate}: measured {link:.3f} Gbit/s TCP goodput node 0 -> node 1", flush=True)
        report = Path(tmp) / "bench.json"
        bench_args = ["-b", args.begin, "-e", args.end, "-f", args.factor, "-n", args.iters, "-r", args.runs,
                      "-w", "1", "--methods", args.methods, "--ranks-per-node", str(k), "--json", str(report),
                      "--quiet"]
        text = run(
            "compcoll.bench.cli:launched", args.nodes * k, args.backend, args=(bench_args,), timeout=args.timeout,
            rank_prefix=[nodes[r // k].prefix() for r in range(args.nodes * k)],
            rank_env=[nodes[r // k].gloo_env() if args.backend == "gloo" else nodes[r // k].mpi_env()
                      for r in range(args.nodes * k)],
            master_addr=nodes[0].address,
        ).strip()
        print(text)
        result = json.loads(report.read_text())
    result.update(rate=args.rate, link_goodput_gbit=link, nodes=args.nodes,
                  command=shlex.join([sys.executable, *sys.argv]))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        header = f"# {result['command']}\n# link {args.rate}: measured {link:.3f} Gbit/s TCP goodput\n"
        args.out.with_suffix(".txt").write_text(header + text + "\n")
        args.out.with_suffix(".json").write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
