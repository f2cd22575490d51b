"""End-to-end training throughput on emulated links, every way of averaging gradients side by side (root only).

DDP's allreduce, PyTorch's fp16 and PowerSGD hooks, compcoll's 1-bit hook, OneBitAdam and 0/1 Adam.

Usage (as root, from the repository root):
    .venv/bin/python bench/network/training.py --out bench/results/network/training

1. For each link rate (``--rates``) and layout (``--layouts``, nodes x ranks per node),
   build the namespaces, measure the link, and run ``training_job.py`` on Gloo ranks
   placed on the nodes: every method in one job, side by side.
2. Every method trains the same MLP (``--width``; 1024-W-W-1024-10) on random batches,
   momentum SGD under the hooks, compcoll's optimizers in their compression phase.
3. Write OUT.json, OUT.txt (samples/s per method and the speed-up over DDP's allreduce)
   and OUT.png.
"""

import argparse
import json
import os
import shlex
import sys
import tempfile
from pathlib import Path

from netns import emulated_nodes, link_rate_gbit, why_unavailable
from scenario import default_threads

from compcoll.launcher import run

LABELS = {"allreduce": "DDP allreduce", "fp16": "fp16 hook", "powersgd": "PowerSGD r=4",
          "onebit": "compcoll 1-bit hook", "onebit_hier": "1-bit hook, by node",
          "onebit_adam": "compcoll OneBitAdam", "zero_one_adam": "compcoll 0/1 Adam"}


def scenario(rate: str, nodes: int, per_node: int, config: dict, timeout: float) -> dict:
    """Run every method on one emulated layout; returns training_job's report with the link's goodput."""
    ranks = nodes * per_node
    threads = str(default_threads(ranks))
    with tempfile.TemporaryDirectory() as tmp, emulated_nodes(nodes, rate) as hosts:
        link = link_rate_gbit(hosts[0], hosts[1])
        print(f"# {rate}, {nodes} x {per_node}: link goodput {link:.3f} Gbit/s", file=sys.stderr, flush=True)
        out = Path(tmp) / "result.json"
        placed = [hosts[r // per_node] for r in range(ranks)]
        run("training_job:train", ranks, "gloo", timeout=timeout, args=(json.dumps({**config, "out": str(out)}),),
            rank_prefix=[node.prefix() for node in placed],
            rank_env=[{**node.gloo_env(), "NUMBA_NUM_THREADS": threads, "OMP_NUM_THREADS": threads,
                       "COMPCOLL_RANKS_PER_NODE": str(per_node)} for node in placed],
            master_addr=hosts[0].address)
        result = json.loads(out.read_text())
    result.update(rate=rate, nodes=nodes, ranks_per_node=per_node, link_goodput_gbit=link,
                  threads_per_rank=int(threads))
    return result


def table(results: list[dict], config: dict) -> str:
    params = results[0]["params"]
    lines = [f"# MLP 1024-{config['width']}-{config['width']}-1024-10 ({params / 1e6:.1f}M parameters, "
             f"{4 * params / 2**20:.0f} MiB of float32 gradients), batch {config['batch']} per rank; median of "
             f"{config['runs']} runs of {config['steps']} steps after {config['warmup']}; Gloo; "
             f"{results[0]['threads_per_rank']} thread(s) per rank on a {os.cpu_count()}-core machine",
             f"{'link':<8}{'layout':>7}{'method':>22}{'ms/step':>10}{'samples/s':>11}{'vs DDP':>8}"]
    for r in results:
        base = r["methods"]["allreduce"]["step_s"]
        for method, m in r["methods"].items():
            lines.append(f"{r['rate']:<8}{r['nodes']:>4}x{r['ranks_per_node']:<2}{LABELS[method]:>22}"
                         f"{1000 * m['step_s']:>10.1f}{m['samples_per_s']:>11.1f}{base / m['step_s']:>7.2f}x")
    return "\n".join(lines)


def plot(results: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(10, 4))
    methods = list(results[0]["methods"])
    width = 0.8 / len(methods)
    for i, method in enumerate(methods):
        ax.bar([j + i * width for j in range(len(results))],
               [r["methods"]["allreduce"]["step_s"] / r["methods"][method]["step_s"] for r in results],
               width, label=LABELS[method])
    ax.set_xticks([j + 0.4 - width / 2 for j in range(len(results))],
                  [f"{r['rate']} {r['nodes']}x{r['ranks_per_node']}" for r in results])
    ax.axhline(1.0, color="black", linewidth=0.5)
    ax.set(ylabel="training steps/s vs DDP's allreduce", title="end-to-end training throughput, emulated links")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rates", default="1gbit,10gbit")
    p.add_argument("--layouts", default="2x1,2x2", help="nodes x ranks per node, comma-separated")
    p.add_argument("--width", type=int, default=4096)
    p.add_argument("--batch", type=int, default=16, help="samples per rank and step")
    p.add_argument("--methods", default=",".join(m for m in LABELS if m != "onebit_hier"),
                   help=f"comma-separated, of {','.join(LABELS)}")
    p.add_argument("--warmup", type=int, default=4)
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--timeout", type=float, default=3000.0)
    p.add_argument("--out", type=Path)
    args = p.parse_args()
    reason = why_unavailable()
    if reason:
        p.exit(2, f"cannot emulate nodes here: {reason}\n")
    config = dict(width=args.width, batch=args.batch, methods=args.methods.split(","), warmup=args.warmup,
                  steps=args.steps, runs=args.runs)
    results = []
    for rate in args.rates.split(","):
        for layout in args.layouts.split(","):
            nodes, per_node = map(int, layout.split("x"))
            results.append(scenario(rate, nodes, per_node, config, args.timeout))
            print(table(results[-1:], config), flush=True)
    text = table(results, config)
    print(text)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        command = shlex.join([sys.executable, *sys.argv])
        args.out.with_suffix(".txt").write_text(f"# {command}\n{text}\n")
        args.out.with_suffix(".json").write_text(json.dumps({"command": command, "config": config,
                                                             "results": results}, indent=1) + "\n")
        plot(results, args.out.with_suffix(".png"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
