"""Convergence under real DDP (digits): the 1-bit hook vs DDP's allreduce, fp16 and PowerSGD; 1-bit Adam in a framework.

Usage (from the repository root; needs scikit-learn and matplotlib: pip install -e '.[bench]'):
    .venv/bin/python bench/convergence/ddp.py --out bench/results/convergence_ddp_digits

1. For every run, start ``--ranks`` Gloo ranks (torchrun-style) that train the digits MLP
   of ``run.py`` under real DDP with momentum SGD, the same seed and batch order, each
   rank its share of every global batch (``ddp_job.py``).
2. Hooks: DDP's default allreduce (the baseline), PyTorch's fp16 and PowerSGD hooks, and
   compcoll's ``onebit_hook`` in four numerics, each with one scale per bucket or chunk
   (``block_size=None``): one compression (allgather) or two (gather-scatter), each with
   the l1 and the l2 scale (GS l2 is DeepSpeed's numerics). The hook's default, a scale per
   64 elements, is measured by bench/scaling/scale.py.
   ``--runs framework`` instead trains Adam under DDP's allreduce (the baseline) and
   compcoll's 1-bit Adam built after DDP wrapped the model (as frameworks do), with
   ``local_hook`` and without it (DDP averages in float32 first).
3. Write OUT.json, OUT.txt (final loss and accuracy, the gap to the baseline, bytes sent per
   rank and the cut against the baseline) and OUT.png.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from run import run_jobs, write_results  # noqa: E402

RUNS = [
    dict(name="DDP allreduce", hook="allreduce", options={}, baseline=None),
    dict(name="fp16 hook", hook="fp16", options={}, baseline="DDP allreduce"),
    dict(name="PowerSGD r=2", hook="powersgd", options=dict(matrix_approximation_rank=2, start_powerSGD_iter=2),
         baseline="DDP allreduce"),
    dict(name="1-bit AG l1", hook="onebit", options=dict(scale="l1", protocol="allgather", block_size=None),
         baseline="DDP allreduce"),
    dict(name="1-bit AG l2", hook="onebit", options=dict(scale="l2", protocol="allgather", block_size=None),
         baseline="DDP allreduce"),
    dict(name="1-bit GS l1", hook="onebit", options=dict(scale="l1", protocol="gather_scatter", block_size=None),
         baseline="DDP allreduce"),
    dict(name="1-bit GS l2", hook="onebit", options=dict(scale="l2", protocol="gather_scatter", block_size=None),
         baseline="DDP allreduce"),
]
FRAMEWORK_RUNS = [
    dict(name="Adam", hook="allreduce", options={}, optimizer="adam", baseline=None),
    dict(name="1-bit Adam local", hook="local", options={}, optimizer="onebit_adam", baseline="Adam"),
    dict(name="1-bit Adam DDP", hook="allreduce", options={}, optimizer="onebit_adam", baseline="Adam"),
]
"""``--runs framework``: compcoll's 1-bit Adam built on a model a framework wrapped in DDP, with the local-gradient
hook and without it (DDP's float32 allreduce, then 1-bit Adam's own average of the already averaged gradients)."""


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ranks", type=int, default=4)
    p.add_argument("--steps", type=int, default=600)
    p.add_argument("--batch", type=int, default=128, help="global batch (split over the ranks)")
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--eval-every", type=int, default=25)
    p.add_argument("--runs", choices=("hooks", "framework"), default="hooks",
                   help="hooks: momentum SGD under each hook; framework: 1-bit Adam with and without local_hook")
    p.add_argument("--freeze", type=float, default=0.15, help="1-bit Adam's warmup, a share of --steps (framework)")
    p.add_argument("--out", type=Path, required=True, help="write OUT.json, OUT.txt and OUT.png")
    args = p.parse_args()
    results = run_jobs("ddp_job:train", RUNS if args.runs == "hooks" else FRAMEWORK_RUNS, args.ranks, "gloo",
                       lambda spec: dict(spec, hidden=args.hidden, batch=args.batch, steps=args.steps, lr=args.lr,
                                         eval_every=args.eval_every, seed=0, freeze=args.freeze))
    write_results(results, report(results, args), args)
    return 0


def report(results: list[dict], args) -> str:
    """Final loss and accuracy, the gap to DDP's allreduce, bytes per rank and the cut against it."""
    base = results[0]
    plain = max(base["bytes_per_rank"])
    trained = f"momentum SGD lr {args.lr}" if args.runs == "hooks" else \
        f"Adam / 1-bit Adam lr {args.lr} (warmup {args.freeze:g} of the run)"
    lines = [
        f"# digits MLP 64-{args.hidden}-{args.hidden}-10 ({base['params']} parameters) under DDP, {trained}, "
        f"{args.ranks} Gloo ranks, global batch {args.batch}, {args.steps} steps",
        "# bytes per rank (max over ranks): compcoll's calls from its counter, DDP's and PyTorch hooks' allreduces "
        "by the ring formula 2(n-1)/n x their buffer; cut = DDP allreduce's bytes / the run's",
        f"{'run':<18}{'final loss':>11}{'test acc':>10}{'acc last 4':>11}{'vs base':>9}{'MB/rank':>10}{'cut':>8}"
        f"{'replicas':>10}",
    ]
    for r in results:
        curve = r["curve"]
        last = sum(c["test_accuracy"] for c in curve[-4:]) / 4
        gap = "" if r["baseline"] is None else \
            f"{100 * (curve[-1]['test_accuracy'] - base['curve'][-1]['test_accuracy']):+.2f}pt"
        sent = max(r["bytes_per_rank"])
        lines.append(f"{r['name']:<18}{curve[-1]['train_loss']:>11.4f}{100 * curve[-1]['test_accuracy']:>9.2f}%"
                     f"{100 * last:>10.2f}%{gap:>9}{sent / 1e6:>10.2f}{plain / sent:>7.1f}x"
                     f"{'same' if r['replicas_identical'] else 'DIFFER':>10}")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
