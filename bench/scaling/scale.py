"""The scaling benchmark: bytes and convergence of compcoll's hooks and optimizers from 2 to 1024 ranks, in one process.

Usage (from the repository root; needs scikit-learn and matplotlib: pip install -e '.[bench]'):
    .venv/bin/python bench/scaling/scale.py bytes --ranks 2 4 16 64 256 1024 --out bench/results/scaling_bytes
    .venv/bin/python bench/scaling/scale.py hooks --ranks 2 16 64 --out bench/results/scaling_hooks
    .venv/bin/python bench/scaling/scale.py optimizers --ranks 2 16 64 --out bench/results/scaling_optimizers
    .venv/bin/python bench/scaling/scale.py lr --ranks 2 16 --out bench/results/scaling_lr
    .venv/bin/python bench/scaling/scale.py stages --ranks 2 16 --adam-lrs 2e-3 --lamb-lrs 1e-2 \
        --out bench/results/scaling_stages
    .venv/bin/python bench/scaling/scale.py plot --out bench/results/scaling

Every rank is a thread of this process (compcoll's numerics are deterministic, so the bits
are those of n real ranks: tests/comm/test_local.py). Each part writes OUT.json and OUT.txt.
1. ``bytes``: a plan's second call of each form on ``local_world(n)`` (``--numel`` float32, 262,151
   by default, a length that is a multiple of nothing; the allgather form on at most
   2^32 / n^2, since every rank receives n copies; lengths are padded to 8n): the flat
   ``compressed_allreduce`` with each protocol, gather-scatter with
   one scale per 64 elements (the hook's default), and the hierarchical form with 8 ranks
   per node (a scale per chunk, and per 64 elements). Bytes per element per rank are the
   communicators' own counts (``bytes_sent``, the most any rank sent, agreement included),
   inter-node bytes those sent to ranks of other nodes (``bytes_sent_to``); beside them a
   float32 ring allreduce's 8 (n-1)/n.
2. ``hooks``: the digits MLP of bench/convergence under real DDP on n threads of torch's
   multi-threaded process group (``tests/ddp/threaded_group.py``), momentum SGD, the global
   batch fixed (``--batch``) and split over the ranks (``ddp_job.py``). Rows: DDP's
   allreduce (the baseline at the same n), PyTorch's fp16 and PowerSGD r=2 and r=4 hooks,
   compcoll's ``onebit_hook`` with its defaults (gather-scatter, one scale per 64
   elements), with one scale per bucket and chunk (each protocol), with 32 and 128
   elements per scale, and the hierarchical form with 8 ranks per node from 16 ranks on
   (a scale per 64 elements, the default, and per chunk).
   Bytes: compcoll's counters and, for PyTorch's hooks, the ring formula on what they send.
3. ``optimizers``: the causal LM of bench/convergence (``job.py``), global batch 64 split
   over the ranks, each optimizer against its uncompressed baseline at the same n (Adam, LAMB,
   Birder with the exact average). Adam and LAMB average every gradient exactly, so they are
   one run whatever n (the same global batch) and run once, at the first n; Birder's exact
   form averages each rank's own ratio m / b, which changes with the rank's share of the
   batch, so it runs at every n (``PER_N_BASELINES``).
4. ``lr``: the optimizers part's LM at several learning rates (``--adam-lrs`` for the Adam
   family, ``--lamb-lrs`` for the LAMBs), rows ``LR_ROWS``: each run against its baseline at
   the same learning rate, and each optimizer's best against its baseline's best (the
   optimizers part holds the bench's one learning rate, at which a baseline may be far
   from its best). Baselines run at the first n only, as in the optimizers part.
5. ``stages``: as the lr part, with rows ``STAGE_ROWS``: per family (1-bit Adam with bias
   correction; 1-bit LAMB) the baseline, the optimizer with the exact average where it sends 1
   bit (its frozen variance alone; like the baselines, one run at the first n), the optimizer
   compressing once (allgather) and twice (gather-scatter, its default from 3 ranks on), and its
   default on nodes of 8 ranks from 16 ranks on (hierarchical). ``stage_report`` splits each flat gap
   into these three factors, per n and rate, beside the hierarchical one.
6. ``plot``: from the three parts' OUT.json (``--out`` prefix + _bytes, _hooks,
   _optimizers), OUT_bytes.png (bytes per element per rank against n, log-log) and
   OUT_gap.png (each run's gap to its baseline against n); the training parts' tables are
   written again from their JSON.
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench" / "convergence"))

import compcoll  # noqa: E402
from compcoll.algorithms.hierarchical import hierarchical_compressed_allreduce, hierarchical_error_numels  # noqa: E402
from compcoll.launcher import run_threads  # noqa: E402

RANKS_PER_NODE = 8
OPTIMIZER_ROWS = ("Adam", "1-bit Adam", "0/1 Adam", "0/1 Adam exact", "0/1 Adam clipper 1", "Birder exact", "Birder",
                  "LAMB", "1-bit LAMB")
"""Rows of bench/convergence/run.py's ``runs`` that the optimizers part trains."""
LR_ROWS = ("Adam", "1-bit Adam", "1-bit Adam bc", "0/1 Adam", "0/1 Adam bc", "LAMB", "1-bit LAMB")
"""Rows of the lr part: each compressed Adam and LAMB against its baseline, at every learning rate."""
STAGES = (("Adam", "Adam frozen v bc", "1-bit Adam bc allgather", "1-bit Adam bc gather-scatter",
           "1-bit Adam bc 8/node"),
          ("LAMB", "LAMB frozen v", "1-bit LAMB allgather", "1-bit LAMB gather-scatter", "1-bit LAMB 8/node"))
"""The stages part's families, each: the baseline, its variance frozen (nothing compressed), compressed once
(allgather), compressed twice (gather-scatter, the default from 3 ranks on), and the default on nodes of
``RANKS_PER_NODE`` ranks (the hierarchical form: float32 inside a node; between 2 nodes allgather, between more
gather-scatter)."""
STAGE_ROWS = tuple(name for family in STAGES for name in family)
"""Rows of the stages part."""
NODE_ROWS = tuple(family[4] for family in STAGES)
"""Rows on nodes of ``RANKS_PER_NODE`` ranks: trained where the ranks form several nodes."""
VARIANTS = {"1-bit Adam bc": ("1-bit Adam", {"bias_correction": True}),
            "0/1 Adam bc": ("0/1 Adam", {"bias_correction": True}),
            "Adam frozen v bc": ("Adam frozen v", {"bias_correction": True}),
            "1-bit Adam bc allgather": ("1-bit Adam", {"bias_correction": True, "protocol": "allgather"}),
            "1-bit LAMB allgather": ("1-bit LAMB", {"protocol": "allgather"}),
            "1-bit Adam bc gather-scatter": ("1-bit Adam", {"bias_correction": True, "protocol": "gather_scatter"}),
            "1-bit LAMB gather-scatter": ("1-bit LAMB", {"protocol": "gather_scatter"}),
            "1-bit Adam bc 8/node": ("1-bit Adam", {"bias_correction": True, "ranks_per_node": RANKS_PER_NODE}),
            "1-bit LAMB 8/node": ("1-bit LAMB", {"ranks_per_node": RANKS_PER_NODE})}
"""Rows of the lr and stages parts that are a row of bench/convergence/run.py with more keyword arguments."""
LAMB_ROWS = ("LAMB", "1-bit LAMB", "LAMB frozen v", "1-bit LAMB allgather", "1-bit LAMB gather-scatter",
             "1-bit LAMB 8/node")
"""Rows of the lr and stages parts that take ``--lamb-lrs``; the others take ``--adam-lrs``."""
EXACT_ROWS = tuple(family[1] for family in STAGES)
"""Rows with a baseline that average every step exactly, so that, like the baselines, one run at the first n
serves every n."""
PER_N_BASELINES = ("Birder exact",)
"""Baselines whose run changes with n: Birder's moments are each rank's own, so its exact average of m / b at 16
ranks (4 sequences a rank) is another optimizer than at 2 (32 a rank)."""


def hook_rows(n: int) -> list[dict]:
    """The DDP rows at n ranks: the baseline, PyTorch's hooks, compcoll's hook in each form."""
    rows = [
        dict(name="DDP allreduce", hook="allreduce", options={}, baseline=None),
        dict(name="fp16 hook", hook="fp16", options={}, baseline="DDP allreduce"),
        dict(name="PowerSGD r=2", hook="powersgd", options=dict(matrix_approximation_rank=2, start_powerSGD_iter=2),
             baseline="DDP allreduce"),
        dict(name="PowerSGD r=4", hook="powersgd", options=dict(matrix_approximation_rank=4, start_powerSGD_iter=2),
             baseline="DDP allreduce"),
        dict(name="1-bit default", hook="onebit", options={}, baseline="DDP allreduce"),
        dict(name="1-bit AG", hook="onebit", options=dict(protocol="allgather", block_size=None),
             baseline="DDP allreduce"),
        dict(name="1-bit GS", hook="onebit", options=dict(protocol="gather_scatter", block_size=None),
             baseline="DDP allreduce"),
        *(dict(name=f"1-bit GS B={b}", hook="onebit", options=dict(protocol="gather_scatter", block_size=b),
               baseline="DDP allreduce") for b in (32, 128)),
    ]
    if n > RANKS_PER_NODE:
        rows.append(dict(name="1-bit hier 8/node", hook="onebit", options=dict(ranks_per_node=RANKS_PER_NODE),
                         baseline="DDP allreduce"))
        rows.append(dict(name="1-bit hier, per chunk", hook="onebit",
                         options=dict(ranks_per_node=RANKS_PER_NODE, block_size=None), baseline="DDP allreduce"))
    return rows


def count_bytes(n: int, numel: int, only: list[str] | None = None) -> list[dict]:
    """Bytes per element of a call of each form on ``local_world(n)``: the most any rank sent, and inter-node.

    The call counted is a plan's second: the first also takes the plan's one-off rounds (the
    node layout, the pieces), which a training run pays once. The allgather form receives n
    compressed copies on every rank (n^2 numel / 8 bytes in all), so it runs on at most
    2^32 / n^2 elements.
    """
    forms = [("flat allgather", dict(protocol="allgather"), False),
             ("flat gather-scatter", dict(protocol="gather_scatter"), False),
             ("gather-scatter B=64", dict(protocol="gather_scatter", block_size=64), False)]
    if n > RANKS_PER_NODE:
        forms += [("hierarchical 8/node", {}, True), ("hierarchical 8/node B=64", dict(block_size=64), True)]
    forms = [form for form in forms if not only or form[0] in only]
    rows = []
    for name, options, hierarchical in forms:
        length = min(numel, 2**32 // n**2) if name == "flat allgather" else numel
        sent = [[0, 0] for _ in range(n)]

        def rank(comm: compcoll.Communicator) -> None:
            x = torch.randn(length, generator=torch.Generator().manual_seed(comm.rank))
            node = comm.rank // RANKS_PER_NODE

            def counts() -> tuple[int, int]:
                inter = sum(b for peer, b in enumerate(comm.bytes_sent_to) if peer // RANKS_PER_NODE != node)
                return comm.bytes_sent, inter

            if hierarchical:
                lengths = hierarchical_error_numels(length, n, RANKS_PER_NODE)
                we, se = (torch.zeros(k) for k in lengths)
                call = functools.partial(hierarchical_compressed_allreduce, x, we, se, comm,
                                         ranks_per_node=RANKS_PER_NODE, **options)
            else:
                call = functools.partial(compcoll.CompressedAllreduce(comm, **options), x)
            call()
            before = counts()
            call()
            sent[comm.rank] = [after - first for after, first in zip(counts(), before)]

        run_threads(rank, n, timeout=1800)
        most, inter = max(s[0] for s in sent), max(s[1] for s in sent)
        rows.append({"n": n, "form": name, "numel": length, "bytes_per_element": most / length,
                     "inter_bytes_per_element": inter / length if hierarchical else None,
                     "ring_float32": 8 * (n - 1) / n})
        print(f"# {n} ranks, {name}: {most / length:.4f} bytes per element (inter-node {inter / length:.4f})",
              flush=True)
    return rows


def bytes_part(args) -> dict:
    rows = []
    for n in args.ranks:
        start = time.perf_counter()
        rows += count_bytes(n, args.numel, args.only)
        print(f"# bytes at {n} ranks: {time.perf_counter() - start:.1f} s", flush=True)
    lines = ["# a plan's second call of numel float32 on local_world(n); bytes per element per rank (the most any rank "
             "sent, counted by the communicators, agreement included); ring = a float32 ring allreduce's 8(n-1)/n",
             f"{'n':>6} {'form':<22}{'numel':>9}{'bytes/elem':>11}{'ring/this':>10}{'inter/elem':>11}"
             f"{'ring/inter':>11}"]
    for r in rows:
        inter = r["inter_bytes_per_element"]
        extra = f"{inter:>11.4f}{r['ring_float32'] / inter:>10.1f}x" if inter else ""
        lines.append(f"{r['n']:>6} {r['form']:<22}{r['numel']:>9}{r['bytes_per_element']:>11.4f}"
                     f"{r['ring_float32'] / r['bytes_per_element']:>9.1f}x{extra}")
    return {"rows": rows, "table": "\n".join(lines)}


def train_rows(args, rows_at, launch, metric: str) -> dict:
    """Train every row of ``rows_at(n)`` at every n (``--only``: those named); ``launch(n, config)`` runs one.

    Rank 0 of each run writes its result to ``config["out"]``; it is kept with its n and
    baseline, and the table is ``report``'s.
    """
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for n in args.ranks:
            for i, spec in enumerate(rows_at(n)):
                if args.only and spec["name"] not in args.only:
                    continue
                out = Path(tmp) / f"{n}-{i}.json"
                start = time.perf_counter()
                launch(n, dict(spec, batch=args.batch, steps=args.steps, eval_every=args.eval_every, seed=args.seed,
                               out=str(out)))
                results.append(dict(json.loads(out.read_text()), n=n, baseline=spec["baseline"]))
                print(f"# {n} ranks, {spec['name']}: {time.perf_counter() - start:.1f} s", flush=True)
    return {"runs": results, "table": report(results, metric)}


def hooks_part(args) -> dict:
    import ddp_job
    from tests.ddp.threaded_group import run_threaded_group

    def launch(n: int, config: dict) -> None:
        config = dict(config, hidden=args.hidden, lr=args.lr)
        run_threaded_group(ddp_job.train, n, json.dumps(config), timeout=3600)

    return train_rows(args, hook_rows, launch, "test_accuracy")


def train_lm(n: int, config: dict) -> None:
    """One run of the optimizers' causal LM (bench/convergence, width 64, 2 blocks, context 64) on n thread ranks."""
    config = dict(config, task="lm", hidden=64, layers=2, context=64)
    run_threads("job:train", n, args=(json.dumps(config),), timeout=7200)


def optimizers_part(args) -> dict:
    from run import runs

    specs = {s["name"]: s for s in runs(args.steps, 1e-8, 1e-3, 5e-3, False)}
    rows_at = functools.partial(optimizer_rows, specs, first=args.ranks[0])
    return train_rows(args, rows_at, train_lm, "val_loss")


def lr_part(args) -> dict:
    """Train ``LR_ROWS`` (``--only``: those named) at every learning rate; ``lr_report`` tabulates them."""
    result = rate_rows(args, LR_ROWS)
    return {"runs": result["runs"], "table": lr_report(result["runs"]) + "\n\n" + result["table"]}


def stages_part(args) -> dict:
    """Train ``STAGE_ROWS`` (``--only``: those named) at every learning rate; ``stage_report`` splits each
    compressed optimizer's gap into the cost of its frozen variance and of each 1-bit compression."""
    result = rate_rows(args, STAGE_ROWS)
    return {"runs": result["runs"], "table": stage_report(result["runs"]) + "\n\n" + result["table"]}


def rate_rows(args, names: tuple[str, ...]) -> dict:
    """Train the rows ``names`` (``--only``: those named) at every learning rate (``train_rows``).

    1. A row of ``LAMB_ROWS`` runs at each of ``--lamb-lrs``, any other at each of ``--adam-lrs``,
       with bench/convergence/run.py's settings at that rate.
    2. A run's name gains its rate ("1-bit Adam lr=0.002"), its baseline the same rate, so that
       ``train_rows`` and ``report`` set each run against its baseline at the same rate.
    3. ``VARIANTS`` rows are their run.py row with more keyword arguments ("... bc":
       ``bias_correction=True``).
    4. Baselines and ``EXACT_ROWS`` run at the first n only, ``NODE_ROWS`` where n is at least two nodes of
       ``RANKS_PER_NODE``; every other row at every n.
    """
    from run import runs

    specs = {lr: {s["name"]: s for s in runs(args.steps, 1e-8, lr, lr, False)}
             for lr in (*args.adam_lrs, *args.lamb_lrs)}

    def rows_at(n: int) -> list[dict]:
        rows = []
        for name in names:
            for lr in args.lamb_lrs if name in LAMB_ROWS else args.adam_lrs:
                source, more = VARIANTS.get(name, (name, {}))
                spec = dict(specs[lr][source], kwargs=dict(specs[lr][source]["kwargs"], **more))
                once = not spec["baseline"] or name in EXACT_ROWS
                here = n == args.ranks[0] if once else n >= 2 * RANKS_PER_NODE or name not in NODE_ROWS
                if here and (not args.only or name in args.only):
                    rows.append(dict(spec, name=rated(name, lr),
                                     baseline=spec["baseline"] and rated(spec["baseline"], lr)))
        return rows

    return train_rows(argparse.Namespace(**{**vars(args), "only": None}), rows_at, train_lm, "val_loss")


def rated(name: str, lr: float) -> str:
    """The name of a row's run at a learning rate ("1-bit Adam lr=0.002"), as ``rate_rows`` names them."""
    return f"{name} lr={lr:g}"


def row(name: str) -> str:
    """The row of a run named by ``rated``."""
    return name.split(" lr=")[0]


def lr_report(results: list[dict]) -> str:
    """Per n and optimizer: the final validation loss at each learning rate, the best, and the best against the
    baseline's best (the baselines' runs at the first n serve every n)."""
    def rate(result: dict) -> float:
        return result["kwargs"]["lr"]

    lines = [f"{'n':>5} {'optimizer':<15}{'learning rate: validation loss':<80}{'best':>17}{'vs base best':>13}"]
    for n in dict.fromkeys(r["n"] for r in results):
        for name in dict.fromkeys(row(r["name"]) for r in results if r["n"] == n):
            mine = sorted((r for r in results if r["n"] == n and row(r["name"]) == name), key=rate)
            losses = {rate(r): r["curve"][-1]["val_loss"] for r in mine}
            best = min(losses, key=losses.__getitem__)
            cells = "  ".join(f"{lr:g}: {loss:.4f}" for lr, loss in losses.items())
            base_name = mine[0]["baseline"] and row(mine[0]["baseline"])
            base = [r["curve"][-1]["val_loss"] for r in results
                    if r["baseline"] is None and row(r["name"]) == base_name]
            against = f"{100 * (losses[best] / min(base) - 1):+.1f}%" if base else ""
            lines.append(f"{n:>5} {name:<15}{cells:<80}{f'{losses[best]:.4f} at {best:g}':>17}{against:>13}")
    return "\n".join(lines)


def stage_report(results: list[dict]) -> str:
    """Per n, learning rate and family of ``STAGES``: the final validation losses, and the compressed optimizer's gap
    to its baseline split in three factors, each a ratio of losses minus 1 (runs at the first n serve every n): the
    frozen variance (frozen v against the baseline), the senders' 1-bit compression (allgather against frozen v) and
    the second 1-bit compression of the ranks that sum each chunk (gather-scatter against allgather); then the total,
    and the default's on nodes of ``RANKS_PER_NODE`` against the baseline."""
    def loss(name: str, lr: float, n: int, once: bool) -> float | None:
        found = [r for r in results if r["name"] == rated(name, lr) and (once or r["n"] == n)]
        same = [r for r in found if r["n"] == n]
        return (same or found or [{"curve": [{"val_loss": None}]}])[0]["curve"][-1]["val_loss"]

    def factor(over: float | None, under: float | None) -> str:
        return f"{100 * (over / under - 1):+.1f}%" if over and under else "-"

    columns = ("baseline", "frozen v", "allgather", "gather-sc.", f"{RANKS_PER_NODE}/node", "freeze", "senders",
               "summers", "total", f"{RANKS_PER_NODE}/node")
    lines = [f"{'n':>5} {'family':<6}{'lr':>8}" + "".join(f"{c:>11}" for c in columns)]
    for n in sorted({r["n"] for r in results}):
        for family in STAGES:
            for lr in sorted({r["kwargs"]["lr"] for r in results if row(r["name"]) in family}):
                base, frozen, once, twice, nodes = (loss(name, lr, n, i < 2) for i, name in enumerate(family))
                if not (once or twice or nodes):
                    continue
                cells = [f"{x:.4f}" if x else "-" for x in (base, frozen, once, twice, nodes)]
                cells += [factor(frozen, base), factor(once, frozen), factor(twice, once), factor(twice, base),
                          factor(nodes, base)]
                lines.append(f"{n:>5} {family[0]:<6}{lr:>8g}" + "".join(f"{c:>11}" for c in cells))
    return "\n".join(lines)


def optimizer_rows(specs: dict[str, dict], n: int, first: int) -> list[dict]:
    """The rows of ``OPTIMIZER_ROWS`` (``specs`` by name) trained at n ranks: every compressed run at every n, a
    baseline at the ``first`` n only, but one of ``PER_N_BASELINES`` at every n."""
    return [specs[name] for name in OPTIMIZER_ROWS
            if specs[name]["baseline"] or name in PER_N_BASELINES or n == first]


def report(results: list[dict], metric: str) -> str:
    """One line per run: n, final metric, its gap to the baseline (at the same n, or the one baseline run), bytes.

    Digits: test accuracy, gap in points. LM: validation loss, gap in percent. Bytes per
    element per rank per step: over the run, the most any rank sent / (parameters x steps),
    warm-up included; late, rank 0's over the last evaluation interval (compressed steps).
    """
    width = max([20, *(len(r["name"]) + 1 for r in results)])
    lines = [f"{'n':>5} {'run':<{width}}{metric:>14}{'vs base':>9}{'B/elem/step':>12}{'vs ring':>8}{'late B/el':>10}"
             f"{'vs ring':>8}"]
    for r in results:
        value = r["curve"][-1][metric]
        has_base = any(b["name"] == r["baseline"] for b in results)
        against = "" if not has_base else (f"{gap(r, results, metric):+.2f}pt" if metric == "test_accuracy"
                                           else f"{gap(r, results, metric):+.1f}%")
        last, before = r["curve"][-1], r["curve"][-2]
        per_element = max(r["bytes_per_rank"]) / (r["params"] * last["step"])
        late = (last["bytes"] - before["bytes"]) / (r["params"] * (last["step"] - before["step"]))
        ring = 8 * (r["n"] - 1) / r["n"]
        shown = f"{100 * value:.2f}%" if metric == "test_accuracy" else f"{value:.4f}"
        lines.append(f"{r['n']:>5} {r['name']:<{width}}{shown:>14}{against:>9}{per_element:>12.4f}"
                     f"{ring / per_element:>7.1f}x{late:>10.4f}{ring / late:>7.1f}x")
    return "\n".join(lines)


def gap(run: dict, runs: list[dict], metric: str) -> float:
    """A run's final metric against its baseline's (at the same n, else the one baseline run): points or percent."""
    same = [b for b in runs if b["name"] == run["baseline"]]
    base = next((b for b in same if b["n"] == run["n"]), same[0])
    value, reference = run["curve"][-1][metric], base["curve"][-1][metric]
    return 100 * (value - reference) if metric == "test_accuracy" else 100 * (value / reference - 1)


def label_ranks(ax, ranks: list[int]) -> None:
    """A log x axis labelled at the world sizes that ran, and nowhere else."""
    ax.set_xscale("log")
    ax.set_xticks(ranks, [str(n) for n in ranks])
    ax.minorticks_off()


def plot_part(args) -> dict:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    prefix = str(args.out)
    counted = json.loads(Path(prefix + "_bytes.json").read_text())["rows"]
    fig, ax = plt.subplots(figsize=(6, 4))
    for form in dict.fromkeys(r["form"] for r in counted):
        rows = [r for r in counted if r["form"] == form]
        ax.plot([r["n"] for r in rows], [r["bytes_per_element"] for r in rows], "o-", label=form)
        if rows[0]["inter_bytes_per_element"] is not None:
            ax.plot([r["n"] for r in rows], [r["inter_bytes_per_element"] for r in rows], "o--",
                    label=f"{form}, inter-node")
    ring = sorted({r["n"] for r in counted})
    ax.plot(ring, [8 * (n - 1) / n for n in ring], "k-", label="float32 ring allreduce")
    ax.plot(ring, [8 * (n - 1) / n / 25 for n in ring], "k:", label="1/25 of the ring (the aim)")
    ax.set(yscale="log", xlabel="ranks n", ylabel="bytes per element per rank",
           title="one call, counted by the communicators")
    label_ranks(ax, ring)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(prefix + "_bytes.png", dpi=110)
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for ax, part, metric, unit in ((axes[0], "hooks", "test_accuracy", "test accuracy vs DDP allreduce (points)"),
                                   (axes[1], "optimizers", "val_loss", "validation loss vs baseline (%)")):
        runs = json.loads(Path(f"{prefix}_{part}.json").read_text())["runs"]
        Path(f"{prefix}_{part}.txt").write_text(report(runs, metric) + "\n")
        for name in dict.fromkeys(r["name"] for r in runs if r["baseline"]):
            rows = [r for r in runs if r["name"] == name]
            ax.plot([r["n"] for r in rows], [gap(r, runs, metric) for r in rows], "o-", label=name)
        ax.axhline(0, color="k", lw=0.8)
        ax.set(xlabel="ranks n (global batch fixed)", ylabel=unit,
               title="DDP hooks, digits MLP, momentum SGD" if part == "hooks" else "optimizers, causal LM")
        label_ranks(ax, sorted({r["n"] for r in runs}))
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(prefix + "_gap.png", dpi=110)
    return {"table": f"wrote {prefix}_bytes.png and {prefix}_gap.png"}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("part", choices=("bytes", "hooks", "optimizers", "lr", "stages", "plot"))
    p.add_argument("--ranks", type=int, nargs="+", default=[2, 16, 64])
    p.add_argument("--numel", type=int, default=262151, help="bytes: elements per call")
    p.add_argument("--steps", type=int, help="training steps (hooks 300, optimizers 400)")
    p.add_argument("--batch", type=int, help="global batch, split over the ranks (hooks 256, optimizers 64)")
    p.add_argument("--hidden", type=int, default=256, help="hooks: the digits MLP's hidden units")
    p.add_argument("--lr", type=float, default=0.05, help="hooks: momentum SGD's learning rate")
    p.add_argument("--adam-lrs", type=float, nargs="+", default=[5e-4, 1e-3, 2e-3, 4e-3, 8e-3],
                   help="lr, stages: the Adam family's learning rates")
    p.add_argument("--lamb-lrs", type=float, nargs="+", default=[5e-3, 1e-2, 1.5e-2, 2e-2],
                   help="lr, stages: the LAMBs' learning rates")
    p.add_argument("--eval-every", type=int, default=25)
    p.add_argument("--seed", type=int, default=0, help="the order of the batches (the model's initial weights stay)")
    p.add_argument("--only", nargs="*", help="only these rows (by name; bytes: forms)")
    p.add_argument("--out", type=Path, required=True, help="write OUT.json and OUT.txt")
    args = p.parse_args()
    args.steps = args.steps or (300 if args.part == "hooks" else 400)
    args.batch = args.batch or (256 if args.part == "hooks" else 64)
    torch.set_num_threads(1)
    parts = {"bytes": bytes_part, "hooks": hooks_part, "optimizers": optimizers_part, "lr": lr_part,
             "stages": stages_part, "plot": plot_part}
    result = parts[args.part](args)
    print(result["table"])
    if args.part == "plot":
        return 0
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.with_suffix(".txt").write_text(result["table"] + "\n")
    args.out.with_suffix(".json").write_text(json.dumps({"settings": vars(args) | {"out": str(args.out)},
                                                         "command": " ".join(sys.argv), **result}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
