"""Does a transport move data while its rank computes? The probe behind the pipelined call's overlap (root only).

Usage (from the repository root, as root):
    .venv/bin/python bench/network/progress.py --rate 1gbit --out bench/results/network/pipelined/progress

Pipelining hides the wire only if an operation that has been started moves its bytes while
the rank runs kernels. On 2 emulated nodes x 1 rank (``netns.emulated_nodes``), for each
backend and size, the median over ``--runs`` of:
1. ``start``: the time of ``comm.alltoall(..., async_op=True)`` (the size goes to the peer,
   as much stays), then of its ``wait()`` right after (``wait``);
2. the same with 5 ms between the two spent in ``time.sleep`` (``wait after sleep``), and
   spent in compcoll's kernels, back to back on one thread (``wait after kernels``).
A transport that progresses on its own finishes during the 5 ms; one that progresses only
inside its own calls, or that the kernels starve of the core, leaves the whole transfer to
``wait``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from compcoll import codecs  # noqa: E402
from compcoll.comm import Communicator  # noqa: E402
from compcoll.launcher import run  # noqa: E402
from netns import emulated_nodes, link_rate_gbit  # noqa: E402

PAUSE_S = 0.005
KERNEL_ELEMENTS = 1 << 20
MODES = ("wait", "wait after sleep", "wait after kernels")


def _kernels_for(seconds: float, x: torch.Tensor, error: torch.Tensor) -> None:
    """Run compcoll's compensated-sum kernel back to back on ``x`` for ``seconds``."""
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        codecs.compensated_sum(x, error)


def probe(comm: Communicator, sizes: list[int], runs: int) -> None:
    """Rank body: for each size in bytes, the medians of steps 1-2 in ms; rank 0 prints one JSON line."""
    x, error = torch.randn(KERNEL_ELEMENTS), torch.zeros(KERNEL_ELEMENTS)
    pauses = {"wait": lambda: None, "wait after sleep": lambda: time.sleep(PAUSE_S),
              "wait after kernels": lambda: _kernels_for(PAUSE_S, x, error)}
    rows = []
    for size in sizes:
        send = torch.ones(comm.size * size, dtype=torch.uint8)
        recv = torch.empty_like(send)
        row: dict[str, float | int] = {"bytes": size}
        for mode in MODES:
            starts, waits = [], []
            for _ in range(runs + 1):
                comm.barrier()
                began = time.perf_counter()
                work = comm.alltoall(send, recv, async_op=True)
                started = time.perf_counter()
                pauses[mode]()
                paused = time.perf_counter()
                work.wait()
                waits.append(time.perf_counter() - paused)
                starts.append(started - began)
            row[f"start ({mode}) ms"] = statistics.median(starts[1:]) * 1e3
            row[f"{mode} ms"] = statistics.median(waits[1:]) * 1e3
        rows.append(row)
    if comm.rank == 0:
        print("PROBE " + json.dumps(rows), flush=True)


def probe_link(rate: str, sizes: list[int], runs: int, backends: list[str]) -> tuple[str, dict]:
    """(table, report) of ``probe`` on 2 emulated nodes joined by a ``rate`` link, per backend."""
    report: dict = {"rate": rate, "pause_ms": PAUSE_S * 1e3, "runs": runs}
    lines = [f"# 2 emulated nodes x 1 rank, 1 compute thread each; {runs} runs, medians; pause {PAUSE_S * 1e3:g} ms "
             f"between start and wait"]
    with emulated_nodes(2, rate) as hosts:
        report["link_goodput_gbit"] = link_rate_gbit(hosts[0], hosts[1])
        lines.append(f"# link {rate}: measured {report['link_goodput_gbit']:.3f} Gbit/s TCP goodput")
        lines.append(f"# {'backend':>8} {'bytes':>9} | {'start ms':>8} {'wait ms':>8} | "
                     f"{'wait after sleep':>16} | {'wait after kernels':>18}")
        for backend in backends:
            text = run(f"{Path(__file__).stem}:probe", 2, backend, timeout=600, args=(sizes, runs),
                       rank_prefix=[h.prefix() for h in hosts],
                       rank_env=[{**h.env(backend), "NUMBA_NUM_THREADS": "1"} for h in hosts],
                       master_addr=hosts[0].address)
            rows = json.loads(next(line for line in text.splitlines() if line.startswith("PROBE "))[6:])
            report[backend] = rows
            for row in rows:
                lines.append(f"  {backend:>8} {row['bytes']:>9} | {row['start (wait) ms']:>8.2f} "
                             f"{row['wait ms']:>8.2f} | {row['wait after sleep ms']:>16.2f} | "
                             f"{row['wait after kernels ms']:>18.2f}")
    return "\n".join(lines), report


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rate", default="1gbit", help="tc tbf rate of the link (1gbit)")
    p.add_argument("--sizes", default="131072,1048576", help="bytes each rank sends its peer, comma-separated")
    p.add_argument("--runs", type=int, default=9)
    p.add_argument("--backends", default="gloo,mpi")
    p.add_argument("--out", type=Path, help="write OUT.txt and OUT.json")
    args = p.parse_args()
    table, report = probe_link(args.rate, [int(s) for s in args.sizes.split(",")], args.runs,
                               args.backends.split(","))
    report["command"] = " ".join([sys.executable, *sys.argv])
    text = f"# {report['command']}\n{table}\n"
    print(text, end="")
    if args.out:
        args.out.with_suffix(".txt").write_text(text)
        args.out.with_suffix(".json").write_text(json.dumps(report, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
