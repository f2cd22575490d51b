"""Convergence of the four optimizers against uncompressed Adam / LAMB on real data (digits), bytes from compcoll's counters.

Usage (from the repository root; needs scikit-learn and matplotlib: pip install -e '.[bench]'):
    .venv/bin/python bench/convergence/run.py --out bench/results/convergence_digits

1. For every run, start ``--ranks`` MPI ranks that train the same MLP on scikit-learn's
   bundled 8x8 digits (1437 train / 360 test images, no download), the same seed and
   batch order, each rank a quarter of every global batch (``digits_job.py``).
2. Baselines: torch.optim.Adam on the exact average of the gradients every step, and
   OneBitLamb with its warmup never ending (= LAMB, uncompressed every step).
3. Write OUT.json (curves, bytes per rank, settings), OUT.txt (final loss and accuracy
   side by side, bytes per rank and the reduction against the uncompressed allreduce) and
   OUT.png (loss and accuracy curves).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from compcoll.launcher import run  # noqa: E402

EPS = 1e-4


def runs(steps: int) -> list[dict]:
    """(name, optimizer, kwargs, baseline name) of every run; phases scale with ``steps``."""
    return [
        dict(name="Adam", optimizer="Adam", kwargs=dict(lr=1e-3, eps=EPS), baseline=None),
        dict(name="1-bit Adam", optimizer="OneBitAdam", baseline="Adam",
             kwargs=dict(lr=1e-3, eps=EPS, freeze_step=steps * 3 // 20)),
        dict(name="0/1 Adam", optimizer="ZeroOneAdam", baseline="Adam",
             kwargs=dict(lr=1e-3, eps=EPS, var_freeze_step=steps // 5, local_step_scaler=steps // 10,
                         local_step_clipper=16)),
        dict(name="Birder", optimizer="Birder", baseline="Adam", kwargs=dict(lr=1e-3)),
        dict(name="LAMB", optimizer="OneBitLamb", baseline=None, kwargs=dict(lr=5e-3, eps=EPS, freeze_step=10**9)),
        dict(name="1-bit LAMB", optimizer="OneBitLamb", baseline="LAMB",
             kwargs=dict(lr=5e-3, eps=EPS, freeze_step=steps * 3 // 20)),
    ]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ranks", type=int, default=4)
    p.add_argument("--steps", type=int, default=600)
    p.add_argument("--batch", type=int, default=128, help="global batch (split over the ranks)")
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--eval-every", type=int, default=25)
    p.add_argument("--ranks-per-node", type=int, help="emulate nodes of k consecutive ranks (COMPCOLL_RANKS_PER_NODE)")
    p.add_argument("--out", type=Path, required=True, help="write OUT.json, OUT.txt and OUT.png")
    args = p.parse_args()
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for i, spec in enumerate(runs(args.steps)):
            out = Path(tmp) / f"{i}.json"
            config = dict(spec, hidden=args.hidden, batch=args.batch, steps=args.steps, eval_every=args.eval_every,
                          seed=0, out=str(out))
            env = {"COMPCOLL_RANKS_PER_NODE": str(args.ranks_per_node)} if args.ranks_per_node else None
            run("digits_job:train", args.ranks, "mpi", args=(json.dumps(config),), timeout=1800, env=env)
            result = json.loads(out.read_text())
            result["baseline"] = spec["baseline"]
            results.append(result)
            print(f"# {spec['name']}: done in {result['seconds']:.1f} s", flush=True)
    table = report(results, args)
    print(table)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.with_suffix(".txt").write_text(table + "\n")
    args.out.with_suffix(".json").write_text(json.dumps({"settings": vars(args) | {"out": str(args.out)},
                                                         "command": " ".join(sys.argv), "runs": results}, indent=1))
    plot(results, args.out.with_suffix(".png"))
    return 0


def report(results: list[dict], args) -> str:
    """The side-by-side table: final loss and accuracy, the gap to the baseline, bytes and the reduction."""
    by_name = {r["name"]: r for r in results}
    uncompressed = max(by_name["Adam"]["bytes_per_rank"])
    inter_uncompressed = max(by_name["Adam"]["inter_bytes_per_rank"])
    nodes = results[0]["nodes"]
    lines = [
        f"# digits MLP 64-{args.hidden}-{args.hidden}-10 ({results[0]['params']} parameters), {args.ranks} MPI ranks "
        f"as {nodes} node(s), global batch {args.batch}, {args.steps} steps; bytes = comm.bytes_sent per rank "
        f"(max over ranks), inter = the part sent to other nodes",
        "# reduction = bytes of the uncompressed allreduce every step (the Adam run) / bytes of the run",
        f"{'run':<12}{'final loss':>11}{'test acc':>10}{'acc last 4':>11}{'vs base':>9}{'MB/rank':>10}{'reduction':>11}"
        + (f"{'inter MB':>10}{'inter red.':>11}" if nodes > 1 else ""),
    ]
    for r in results:
        curve = r["curve"]
        last = sum(c["test_accuracy"] for c in curve[-4:]) / 4
        base = by_name.get(r["baseline"]) if r["baseline"] else None
        gap = "" if base is None else f"{100 * (curve[-1]['test_accuracy'] - base['curve'][-1]['test_accuracy']):+.2f}pt"
        sent = max(r["bytes_per_rank"])
        lines.append(f"{r['name']:<12}{curve[-1]['train_loss']:>11.4f}{100 * curve[-1]['test_accuracy']:>9.2f}%"
                     f"{100 * last:>10.2f}%{gap:>9}{sent / 1e6:>10.2f}{uncompressed / sent:>10.1f}x"
                     + (f"{max(r['inter_bytes_per_rank']) / 1e6:>10.2f}"
                        f"{inter_uncompressed / max(r['inter_bytes_per_rank']):>10.1f}x" if nodes > 1 else ""))
    return "\n".join(lines)


def plot(results: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (loss_ax, acc_ax) = plt.subplots(1, 2, figsize=(11, 4))
    for r in results:
        steps = [c["step"] for c in r["curve"]]
        style = "--" if r["baseline"] is None else "-"
        loss_ax.plot(steps, [c["train_loss"] for c in r["curve"]], style, label=r["name"])
        acc_ax.plot(steps, [100 * c["test_accuracy"] for c in r["curve"]], style, label=r["name"])
    loss_ax.set(yscale="log", xlabel="step", ylabel="training loss (whole train set)", title="loss")
    acc_ax.set(xlabel="step", ylabel="test accuracy (%)", ylim=(80, 100), title="accuracy")
    acc_ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    sys.exit(main())
