"""Convergence of the four optimizers against uncompressed Adam / LAMB on real data, bytes from compcoll's counters.

Usage (from the repository root; needs scikit-learn and matplotlib: pip install -e '.[bench]'):
    .venv/bin/python bench/convergence/run.py --out bench/results/convergence_digits
    .venv/bin/python bench/convergence/run.py --task lm --hidden 64 --steps 400 --out bench/results/convergence_lm

1. For every run, start ``--ranks`` MPI ranks (``--backend threads``: threads) that train the same model on the same
   batches, each rank its share of every global batch (``job.py``; the tasks are in
   ``tasks.py``, on data that ships with installed packages, no download): ``digits``, an
   MLP on scikit-learn's 8x8 digits (1437 train / 360 test images); ``lm``, a causal
   transformer predicting the next byte of Python's reference docs (``pydoc_data``).
2. Baselines: torch.optim.Adam on the exact average of the gradients every step,
   OneBitLamb with its warmup never ending (= LAMB, uncompressed every step), and Birder
   with the exact average of its ratios (``job.ExactBirder``); the table also gives every
   run against Adam. "Adam frozen v" and "LAMB frozen v" are 1-bit Adam and 1-bit LAMB with
   the exact average where they send 1 bit (``job.FrozenVarianceAdam``,
   ``job.FrozenVarianceLamb``): their frozen variance without compression; "0/1 Adam exact"
   is 0/1 Adam so (``job.ExactZeroOneAdam``): its local steps without compression; "0/1 Adam
   clipper 1" synchronises at every step of its local phase (``local_step_clipper=1``). The runs
   named "... m" compress the momentum, as DeepSpeed does (``compress="momentum"``, and
   the l2 scale; 1-bit LAMB m also freezes the trust ratios as DeepSpeed does), beside
   the defaults (the update direction m / (sqrt(v) + eps)). "1-bit LAMB refresh" takes
   an exact step that refreshes v every 20 compression-phase steps, compresses once and
   gives each layer its own 1-bit scale (``variance_refresh=20, protocol="allgather",
   layer_scales=True``, flat).
   "1-bit Adam bf16" trains a bfloat16 model (the optimizer keeps float32 master weights)
   and is compared with the float32 "1-bit Adam" run. 0/1 Adam's phases scale with the
   run: variance refreshes until ``steps // 5``, local intervals doubling every
   ``steps // 10`` steps and capped at 2 (DeepSpeed's cap of 16 and scaler of 32768 suit
   runs of 10^5 steps; docs/guides/optimizers.md). With ``--deepspeed`` (needs
   ``pip install -e '.[deepspeed]'``), DeepSpeed 0.19.6's own OnebitAdam runs too, in its
   engine on Gloo ranks (``job.DeepSpeedOneBitAdam``), with 1-bit Adam's settings and,
   like every other run, no gradient clipping; then the runs "... clip" clip gradients to
   norm 1.0, DeepSpeed's engine default: Adam the averaged gradient, 1-bit Adam each
   rank's own before its step, DeepSpeed as its engine does.
3. Write OUT.json (curves, bytes per rank, settings), OUT.txt (final loss and the task's
   metric side by side, bytes per rank and the reduction against the uncompressed
   allreduce) and OUT.png (loss and metric curves).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path
from typing import Callable

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "peers"))

from compcoll.launcher import run  # noqa: E402


def runs(steps: int, eps: float, lr: float, lamb_lr: float, deepspeed: bool) -> list[dict]:
    """(name, optimizer, kwargs, baseline name) of every run; phases scale with ``steps``."""
    freeze = steps * 3 // 20
    onebit = dict(lr=lr, eps=eps, freeze_step=freeze)
    zero_one = dict(lr=lr, eps=eps, var_freeze_step=steps // 5, local_step_scaler=steps // 10, local_step_clipper=2)
    peer = [
        dict(name="DS 1-bit Adam", optimizer="DeepSpeedOneBitAdam", baseline="Adam", backend="gloo", kwargs=onebit),
        dict(name="Adam clip", optimizer="Adam", baseline=None, clip=1.0, kwargs=dict(lr=lr, eps=eps)),
        dict(name="1-bit Adam clip", optimizer="OneBitAdam", baseline="Adam clip", clip=1.0, kwargs=onebit),
        dict(name="DS 1-bit Adam clip", optimizer="DeepSpeedOneBitAdam", baseline="Adam clip", backend="gloo",
             clip=1.0, kwargs=onebit),
    ] if deepspeed else []
    return [
        dict(name="Adam", optimizer="Adam", kwargs=dict(lr=lr, eps=eps), baseline=None),
        dict(name="1-bit Adam", optimizer="OneBitAdam", baseline="Adam",
             kwargs=dict(lr=lr, eps=eps, freeze_step=freeze)),
        dict(name="Adam frozen v", optimizer="FrozenVarianceAdam", baseline="Adam", kwargs=onebit),
        dict(name="1-bit Adam bf16", optimizer="OneBitAdam", baseline="1-bit Adam", dtype="bfloat16",
             kwargs=dict(lr=lr, eps=eps, freeze_step=freeze)),
        dict(name="1-bit Adam m", optimizer="OneBitAdam", baseline="Adam",
             kwargs=dict(lr=lr, eps=eps, freeze_step=freeze, compress="momentum", scale="l2")),
        dict(name="0/1 Adam", optimizer="ZeroOneAdam", baseline="Adam", kwargs=zero_one),
        dict(name="0/1 Adam exact", optimizer="ExactZeroOneAdam", baseline="Adam", kwargs=zero_one),
        dict(name="0/1 Adam clipper 1", optimizer="ZeroOneAdam", baseline="Adam",
             kwargs=dict(zero_one, local_step_clipper=1)),
        dict(name="Birder exact", optimizer="ExactBirder", baseline=None, kwargs=dict(lr=lr)),
        dict(name="Birder", optimizer="Birder", baseline="Birder exact", kwargs=dict(lr=lr)),
        dict(name="LAMB", optimizer="OneBitLamb", baseline=None, kwargs=dict(lr=lamb_lr, eps=eps, freeze_step=10**9)),
        dict(name="LAMB frozen v", optimizer="FrozenVarianceLamb", baseline="LAMB",
             kwargs=dict(lr=lamb_lr, eps=eps, freeze_step=freeze)),
        dict(name="1-bit LAMB", optimizer="OneBitLamb", baseline="LAMB",
             kwargs=dict(lr=lamb_lr, eps=eps, freeze_step=freeze)),
        dict(name="1-bit LAMB m", optimizer="OneBitLamb", baseline="LAMB",
             kwargs=dict(lr=lamb_lr, eps=eps, freeze_step=freeze, compress="momentum", scale="l2",
                         trust_ratio="frozen")),
        dict(name="1-bit LAMB refresh", optimizer="OneBitLamb", baseline="LAMB",
             kwargs=dict(lr=lamb_lr, eps=eps, freeze_step=freeze, protocol="allgather", variance_refresh=20,
                         layer_scales=True, hierarchical=False)),
        *peer,
    ]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ranks", type=int, default=4)
    p.add_argument("--steps", type=int, default=600)
    p.add_argument("--batch", type=int, default=128, help="global batch (split over the ranks)")
    p.add_argument("--task", choices=("digits", "lm"), default="digits",
                   help="digits: an MLP on scikit-learn's digits; lm: a causal transformer on Python's docs")
    p.add_argument("--hidden", type=int, default=256, help="digits: hidden units; lm: model width")
    p.add_argument("--layers", type=int, default=2, help="lm: transformer blocks")
    p.add_argument("--context", type=int, default=64, help="lm: bytes per window")
    p.add_argument("--lr", type=float, default=1e-3, help="learning rate of the Adam family and Birder")
    p.add_argument("--lamb-lr", type=float, default=5e-3, help="learning rate of the LAMB runs")
    p.add_argument("--eps", type=float, default=1e-8,
                   help="eps of every Adam / LAMB run (torch's and DeepSpeed's default)")
    p.add_argument("--eval-every", type=int, default=25)
    p.add_argument("--seed", type=int, default=0, help="the order of the batches (the model's initial weights stay)")
    p.add_argument("--deepspeed", action="store_true", help="also run DeepSpeed 0.19.6's OnebitAdam (the peer)")
    p.add_argument("--ranks-per-node", type=int, help="emulate nodes of k consecutive ranks (COMPCOLL_RANKS_PER_NODE)")
    p.add_argument("--backend", choices=("mpi", "threads"), default="mpi",
                   help="the ranks: MPI processes, or threads of this process (the bits of MPI: tests/comm)")
    p.add_argument("--out", type=Path, required=True, help="write OUT.json, OUT.txt and OUT.png")
    args = p.parse_args()
    env = {"COMPCOLL_RANKS_PER_NODE": str(args.ranks_per_node)} if args.ranks_per_node else None
    results = run_jobs("job:train", runs(args.steps, args.eps, args.lr, args.lamb_lr, args.deepspeed), args.ranks,
                       args.backend, lambda spec: dict(spec, task=args.task, hidden=args.hidden, layers=args.layers,
                                                       context=args.context, batch=args.batch, steps=args.steps,
                                                       eval_every=args.eval_every, seed=args.seed), env)
    write_results(results, report(results, args), args)
    return 0


def run_jobs(target: str, specs: list[dict], ranks: int, backend: str, config: Callable[[dict], dict],
             env: dict[str, str] | None = None) -> list[dict]:
    """Run ``target`` for each spec on ``ranks`` ranks (the spec's "backend", else ``backend``), one after another.

    1. The job gets ``config(spec)`` as JSON, with "out": a file its rank 0 writes its result to.
    2. Each result gets the spec's "baseline"; a line says when each run is done.
    """
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for i, spec in enumerate(specs):
            out = Path(tmp) / f"{i}.json"
            run(target, ranks, spec.get("backend", backend), args=(json.dumps(dict(config(spec), out=str(out))),),
                timeout=3600, env=env)
            result = json.loads(out.read_text())
            result["baseline"] = spec["baseline"]
            results.append(result)
            print(f"# {spec['name']}: done in {result['seconds']:.1f} s", flush=True)
    return results


def write_results(results: list[dict], table: str, args: argparse.Namespace) -> None:
    """Print ``table``; write it to OUT.txt, the settings, command and curves to OUT.json, the curves to OUT.png."""
    print(table)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.with_suffix(".txt").write_text(table + "\n")
    args.out.with_suffix(".json").write_text(json.dumps({"settings": vars(args) | {"out": str(args.out)},
                                                         "command": " ".join(sys.argv), "runs": results}, indent=1))
    plot(results, args.out.with_suffix(".png"))


def report(results: list[dict], args) -> str:
    """The side-by-side table: final loss, the task's metric and its gap to the baseline, bytes and the reduction.

    Digits: test accuracy (and its mean over the last 4 evaluations), the gaps in points.
    LM: validation loss (nats per byte), the gaps in percent of the other run's. Each run
    is given against its baseline and against Adam.
    """
    by_name = {r["name"]: r for r in results}
    uncompressed = max(by_name["Adam"]["bytes_per_rank"])
    inter_uncompressed = max(by_name["Adam"]["inter_bytes_per_rank"])
    nodes = results[0]["nodes"]
    width = max(len(r["name"]) for r in results) + 1
    if args.task == "digits":
        model = f"digits MLP 64-{args.hidden}-{args.hidden}-10"
        columns = f"{'test acc':>10}{'acc last 4':>11}"
    else:
        model = (f"causal LM on Python's docs (width {args.hidden}, {args.layers} blocks, {args.context}-byte "
                 f"windows)")
        columns = f"{'val loss':>10}{'val last 4':>11}"
    lines = [
        f"# {model} ({results[0]['params']} parameters), {args.ranks} MPI ranks as {nodes} node(s), global batch "
        f"{args.batch}, {args.steps} steps, eps {args.eps:g}; bytes = comm.bytes_sent per rank (max over ranks), "
        f"inter = the part sent to other nodes",
        "# reduction = bytes of the uncompressed allreduce every step (the Adam run) / bytes of the run; - where "
        "compcoll's counters do not see the traffic (DeepSpeed's)",
        f"{'run':<{width}}{'final loss':>11}{columns}{'vs base':>9}{'vs Adam':>9}{'MB/rank':>10}{'reduction':>11}"
        + (f"{'inter MB':>10}{'inter red.':>11}" if nodes > 1 else ""),
    ]
    for r in results:
        curve = r["curve"]
        base = by_name.get(r["baseline"]) if r["baseline"] else None
        if args.task == "digits":
            value, last = (100 * curve[-1]["test_accuracy"], 100 * sum(c["test_accuracy"] for c in curve[-4:]) / 4)
            metric = f"{value:>9.2f}%{last:>10.2f}%"
        else:
            value, last = curve[-1]["val_loss"], sum(c["val_loss"] for c in curve[-4:]) / 4
            metric = f"{value:>10.4f}{last:>11.4f}"
        gap = "" if base is None else _gap(args.task, value, base)
        against_adam = "" if r["name"] == "Adam" else _gap(args.task, value, by_name["Adam"])
        sent, inter = max(r["bytes_per_rank"]), max(r["inter_bytes_per_rank"])
        volume = f"{sent / 1e6:>10.2f}{uncompressed / sent:>10.1f}x" if sent else f"{'-':>10}{'-':>11}"
        if nodes > 1:
            volume += f"{inter / 1e6:>10.2f}{inter_uncompressed / inter:>10.1f}x" if inter else f"{'-':>10}{'-':>11}"
        lines.append(f"{r['name']:<{width}}{curve[-1]['train_loss']:>11.4f}{metric}{gap:>9}{against_adam:>9}{volume}")
    return "\n".join(lines)


def _gap(task: str, value: float, base: dict) -> str:
    """The final metric against another run's: accuracy points (digits) or percent of its validation loss (LM)."""
    if task == "digits":
        return f"{value - 100 * base['curve'][-1]['test_accuracy']:+.2f}pt"
    return f"{100 * (value / base['curve'][-1]['val_loss'] - 1):+.1f}%"


def plot(results: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (loss_ax, metric_ax) = plt.subplots(1, 2, figsize=(11, 4))
    digits = "test_accuracy" in results[0]["curve"][0]
    for r in results:
        steps = [c["step"] for c in r["curve"]]
        style = "--" if r["baseline"] is None else "-"
        loss_ax.plot(steps, [c["train_loss"] for c in r["curve"]], style, label=r["name"])
        metric = [100 * c["test_accuracy"] if digits else c["val_loss"] for c in r["curve"]]
        metric_ax.plot(steps, metric, style, label=r["name"])
    loss_ax.set(yscale="log", xlabel="step", ylabel="training loss", title="loss")
    if digits:
        metric_ax.set(xlabel="step", ylabel="test accuracy (%)", ylim=(80, 100), title="accuracy")
    else:
        metric_ax.set(xlabel="step", ylabel="validation loss (nats / byte)", title="validation loss")
    metric_ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    sys.exit(main())
