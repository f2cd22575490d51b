"""One emulated-network scenario: compcoll.bench across nodes joined by shaped links (root only).

Usage (as root, from the repository root):
    .venv/bin/python bench/network/scenario.py --rate 1gbit --nodes 2 --ranks-per-node 2 \
        -b 1M -e 64M --methods plain,1bit,hier,hier-ef --out /tmp/hier_1gbit_2x2

1. Build ``--nodes`` network namespaces on a bridge, every link shaped to ``--rate``.
2. Measure the link's TCP goodput between node 0 and node 1.
3. Run ``compcoll.bench`` on Gloo or MPI (``--backend``) with ``--ranks-per-node`` ranks
   in each namespace (consecutive ranks per node), the methods side by side, counting
   what each node's link interface sends; rank 0's progress lines go to this script's
   stderr. Every rank gets ``--threads`` compute threads (Numba and torch; default: the
   machine's cores shared out among all ranks, as if each node had its own).
4. Write the table (.txt) and JSON (.json, with the link rate, the goodput and the
   command), then delete the namespaces.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
import tempfile
from pathlib import Path

from netns import INTERFACE, emulated_nodes, link_rate_gbit, why_unavailable

from compcoll.launcher import run


def default_threads(ranks: int) -> int:
    """Compute threads per rank when ``ranks`` ranks share this machine's cores."""
    return max(1, (os.cpu_count() or 1) // ranks)


def run_scenario(rate: str, nodes: int, ranks_per_node: int, backend: str, bench_args: list[str],
                 threads: int, timeout: float) -> tuple[str, dict]:
    """(table, report) of ``compcoll.bench bench_args`` on emulated nodes; see the module's steps."""
    ranks = nodes * ranks_per_node
    with tempfile.TemporaryDirectory() as tmp, emulated_nodes(nodes, rate) as hosts:
        link = link_rate_gbit(hosts[0], hosts[1])
        print(f"# link {rate}: measured {link:.3f} Gbit/s TCP goodput node 0 -> node 1", file=sys.stderr, flush=True)
        report = Path(tmp) / "bench.json"
        placed = [hosts[r // ranks_per_node] for r in range(ranks)]
        compute = {"NUMBA_NUM_THREADS": str(threads), "OMP_NUM_THREADS": str(threads)}
        text = run(
            "compcoll.bench.cli:launched", ranks, backend, timeout=timeout,
            args=([*bench_args, "--ranks-per-node", str(ranks_per_node), "--nic", INTERFACE, "--json", str(report),
                   "--progress", f"/proc/{os.getpid()}/fd/2"],),
            rank_prefix=[node.prefix() for node in placed],
            rank_env=[{**node.env(backend), **compute} for node in placed],
            master_addr=hosts[0].address,
        )
        result = json.loads(report.read_text())
    table = "\n".join(line for line in text.splitlines() if line.startswith(("#", " ")))
    result.update(backend=backend, rate=rate, link_goodput_gbit=link, nodes=nodes, threads_per_rank=threads,
                  cpu_count=os.cpu_count())
    return f"# link {rate}: measured {link:.3f} Gbit/s TCP goodput, {threads} thread(s) per rank\n{table}", result


def parse(p: argparse.ArgumentParser, methods: str) -> argparse.Namespace:
    """Add the sweep options the scenario and suite scripts share, parse the command line,
    and exit with status 2 and the reason when namespaces cannot be made here."""
    p.add_argument("-b", "--begin", default="64K")
    p.add_argument("-e", "--end", default="256M")
    p.add_argument("-f", "--factor", default="4")
    p.add_argument("-n", "--iters", default="1")
    p.add_argument("-r", "--runs", default="5")
    p.add_argument("-w", "--warmup", default="1")
    p.add_argument("--methods", default=methods)
    p.add_argument("--pieces", help="pieces of the 1bit method (default: the library's choice)")
    p.add_argument("--timeout", type=float, default=3000.0, help="seconds per job (3000)")
    args = p.parse_args()
    reason = why_unavailable()
    if reason:
        p.exit(2, f"cannot emulate nodes here: {reason}\n")
    return args


def bench_args(args: argparse.Namespace, methods: str) -> list[str]:
    return ["-b", args.begin, "-e", args.end, "-f", args.factor, "-n", args.iters, "-r", args.runs,
            "-w", args.warmup, "--methods", methods, *(["--pieces", args.pieces] if args.pieces else [])]


def write(out: Path, header: str, table: str, report: dict) -> None:
    """OUT.txt (the command, then the table) and OUT.json."""
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".txt").write_text(f"# {header}\n{table}\n")
    out.with_suffix(".json").write_text(json.dumps(report, indent=1) + "\n")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rate", default="1gbit", help="tc tbf rate of every link (1gbit)")
    p.add_argument("--nodes", type=int, default=2)
    p.add_argument("--ranks-per-node", type=int, default=2)
    p.add_argument("--backend", choices=("gloo", "mpi"), default="gloo",
                   help="Gloo process group, or MPICH over TCP (shared memory and UCX's local transports off)")
    p.add_argument("--threads", type=int, help="compute threads per rank (cores / ranks)")
    p.add_argument("--out", type=Path, help="write OUT.txt and OUT.json")
    args = parse(p, "plain,1bit,hier,hier-ef")
    threads = args.threads or default_threads(args.nodes * args.ranks_per_node)
    table, report = run_scenario(args.rate, args.nodes, args.ranks_per_node, args.backend,
                                 bench_args(args, args.methods), threads, args.timeout)
    print(table)
    command = shlex.join([sys.executable, *sys.argv])
    report["command"] = command
    if args.out:
        write(args.out, command, table, report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
