"""Convergence under real FSDP2 (the causal LM, AdamW): compcoll's compressed reduce-scatter at 1-8 bits, and HSDP's.

Usage (from the repository root; needs matplotlib: pip install -e '.[bench]'):
    .venv/bin/python bench/convergence/fsdp.py --out bench/results/convergence_fsdp_lm

1. For every run, start ``--ranks`` Gloo ranks (torchrun-style) that train run.py's causal
   LM (width 64, 2 blocks, 64-byte windows of Python's docs) under ``fully_shard`` (each
   block and the root a unit) with AdamW, the same seed and batch order, each rank its
   share of every global batch (``fsdp_job.py``).
2. Runs: FSDP2's own float32 reduce-scatter (the baseline); ``compcoll.fsdp.compress`` with
   1, 2, 3, 4 and 8 bits per element and a scale per 64 elements, then its default (3 bits,
   a scale per 32), and the default with float32 error buffers instead of bfloat16; and HSDP
   by hand on 2 nodes of ``--ranks`` / 2 (FSDP's own reduce-scatter inside a node, the hook
   across them in 1, 3 and 4 bits).
3. Write OUT.json, OUT.txt (final and validation loss, the gap to the baseline, bytes sent
   per rank, the cut against the baseline, the error buffers per rank) and OUT.png.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from run import run_jobs, write_results  # noqa: E402

RUNS = [
    dict(name="FSDP float32", form="float32", options={}, baseline=None),
    *(dict(name=f"{b} bit{'s' if b > 1 else ''}, block 64", form="reduce_scatter", options=dict(bits=b, block_size=64),
           baseline="FSDP float32") for b in (1, 2, 3, 4, 8)),
    dict(name="3 bits (default)", form="reduce_scatter", options={}, baseline="FSDP float32"),
    dict(name="3 bits, float32 error", form="reduce_scatter", options=dict(error_dtype="float32"),
         baseline="FSDP float32"),
    *(dict(name=f"HSDP {b}-bit replicas", form="replicas", options=dict(bits=b), baseline="FSDP float32")
      for b in (1, 3, 4)),
]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ranks", type=int, default=4)
    p.add_argument("--steps", type=int, default=400)
    p.add_argument("--batch", type=int, default=64, help="global batch (split over the ranks)")
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--eval-every", type=int, default=25)
    p.add_argument("--only", help="run names separated by semicolons (default: all)")
    p.add_argument("--out", type=Path, required=True, help="write OUT.json, OUT.txt and OUT.png")
    args = p.parse_args()
    chosen = RUNS if not args.only else [r for r in RUNS if r["name"] in args.only.split(";")]
    results = run_jobs("fsdp_job:train", chosen, args.ranks, "gloo",
                       lambda spec: dict(spec, hidden=args.hidden, layers=2, context=64, batch=args.batch,
                                         steps=args.steps, lr=args.lr, eval_every=args.eval_every, seed=args.seed,
                                         ranks_per_node=args.ranks // 2))
    write_results(results, report(results, args), args)
    return 0


def report(results: list[dict], args) -> str:
    """Final training and validation loss, the gap to FSDP's float32 run, bytes and error buffers per rank."""
    base = results[0]
    lines = [
        f"# causal LM on Python's docs (width {args.hidden}, 2 blocks, 64-byte windows; {base['params']} parameters) "
        f"under FSDP2, AdamW lr {args.lr}, {args.ranks} Gloo ranks, global batch {args.batch}, {args.steps} steps, "
        f"seed {args.seed}",
        "# bytes per rank (max over ranks): the gradient reduce-scatters (HSDP: the cross-node allreduces only), "
        "compcoll's from its counter (agreement included), FSDP's float32 by the ring's (n-1)/n of the input; "
        "cut = the same collectives' float32 bytes (the ring's; padding to 8 elements included) / the run's; "
        "errors = compcoll's error buffers (and scratch) per rank",
        f"{'run':<22}{'final loss':>11}{'val loss':>10}{'vs base':>9}{'MB/rank':>10}{'cut':>8}{'errors KB':>11}",
    ]
    for r in results:
        curve = r["curve"]
        gap = ("" if r["baseline"] is None
               else f"{100 * (curve[-1]['val_loss'] / base['curve'][-1]['val_loss'] - 1):+.1f}%")
        sent, plain = max(r["bytes_per_rank"]), max(r["float32_bytes_per_rank"])
        lines.append(f"{r['name']:<22}{curve[-1]['train_loss']:>11.4f}{curve[-1]['val_loss']:>10.4f}{gap:>9}"
                     f"{sent / 1e6:>10.2f}{plain / sent:>7.1f}x{max(r['memory_per_rank']) / 1e3:>11.1f}")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
