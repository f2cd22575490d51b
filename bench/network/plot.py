"""PNG plots of the network suite's JSON: time vs size per method, and speedup vs link bandwidth.

Usage: ``python bench/network/plot.py bench/results/network``
"""

from __future__ import annotations

import json
import sys
from dataclasses import replace
from pathlib import Path

import matplotlib
import numpy as np

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from compcoll.bench.model import predict  # noqa: E402
from compcoll.bench.model_cli import emulated_cluster  # noqa: E402

SPEEDUP_SIZE = 64 << 20
COLORS = {"plain": "black", "1bit": "tab:blue", "hier": "tab:green", "hier-ef": "tab:olive", "fp16": "tab:orange",
          "powersgd": "tab:purple"}
LAYOUT_STYLES = ["-", "--", "-.", ":"]


def load(directory: Path) -> list[dict]:
    """Every scenario report of ``directory``, sorted by layout, rate and backend."""
    reports = [json.loads(p.read_text()) for p in sorted(directory.glob("*_*_*x*.json"))]
    return sorted(reports, key=lambda r: (r["nodes"], r["ranks_per_node"], r["link_goodput_gbit"], r["backend"]))


def _scenario(report: dict) -> str:
    return f"{report['nodes']}x{report['ranks_per_node']} @ {report['rate']}"


def plot_time_vs_size(reports: list[dict], path: Path) -> Path:
    """One panel per scenario: time of one call against size, a line per backend and method."""
    scenarios = list(dict.fromkeys(_scenario(r) for r in reports))
    fig, axes = plt.subplots(1, len(scenarios), figsize=(4.2 * len(scenarios), 4.8), squeeze=False, sharey=True)
    for ax, scenario in zip(axes[0], scenarios):
        for report in (r for r in reports if _scenario(r) == scenario):
            for method in report["methods"]:
                sizes = [row["size"] / (1 << 20) for row in report["rows"]]
                times = [row[method]["time_us"] / 1e3 for row in report["rows"]]
                style, marker = ("--", "s") if report["backend"] == "mpi" else ("-", "o")
                ax.loglog(sizes, times, style, marker=marker, ms=3, color=COLORS.get(method),
                          label=f"{method} ({report['backend']})")
        ax.set_title(scenario)
        ax.set_xlabel("size (MiB of float32)")
        ax.grid(True, which="both", alpha=0.3)
    axes[0][0].set_ylabel("time per allreduce (ms, median)")
    handles = {h.get_label(): h for ax in axes[0] for h in ax.get_lines()}
    fig.legend(handles.values(), handles.keys(), loc="lower center", ncol=len(handles), fontsize=8)
    fig.tight_layout(rect=(0, 0.1, 1, 1))
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _model_lines(ax, runs: list[dict], kernels: dict, size: int, style: str) -> None:
    """The model's speedup of 1bit and hier over plain across link rates, for one layout
    (its latency and threads from the slowest-link run), thin, in the method's colour."""
    base = emulated_cluster(min(runs, key=lambda r: r["link_goodput_gbit"]), kernels)
    rates = np.logspace(-1, 2, 60)
    for method in (m for m in ("1bit", "hier") if m in runs[0]["methods"]):
        speedups = [predict(replace(base, inter_gbit=g), size, "plain").total
                    / predict(replace(base, inter_gbit=g), size, method).total for g in rates]
        ax.semilogx(rates, speedups, style, lw=0.8, alpha=0.6, color=COLORS[method],
                    label=f"model: {method}, {base.nodes}x{base.ranks_per_node}")


def plot_speedup_vs_bandwidth(reports: list[dict], path: Path, size: int = SPEEDUP_SIZE,
                              kernels: dict | None = None) -> Path:
    """Speedup over plain Gloo allreduce at ``size`` bytes against the measured link goodput,
    a line per layout and method (Gloo jobs), and with ``kernels`` (calibrated rates) the
    model's prediction from 0.1 to 100 Gbit/s."""
    fig, ax = plt.subplots(figsize=(6.5, 4.5))
    gloo = [r for r in reports if r["backend"] == "gloo"]
    for i, layout in enumerate(dict.fromkeys((r["nodes"], r["ranks_per_node"]) for r in gloo)):
        runs = [r for r in gloo if (r["nodes"], r["ranks_per_node"]) == layout]
        style = LAYOUT_STYLES[i % len(LAYOUT_STYLES)]
        for method in [m for m in runs[0]["methods"] if m != "plain"]:
            points = [(r["link_goodput_gbit"], row[method]["speedup"]) for r in runs for row in r["rows"]
                      if row["size"] == size]
            if points:
                ax.semilogx(*zip(*points), style, marker="os^v"[i % 4], color=COLORS.get(method),
                            label=f"{method}, {layout[0]}x{layout[1]}")
        if kernels:
            _model_lines(ax, runs, kernels, size, style)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.axhline(1, color="gray", lw=0.8, label="plain Gloo")
    ax.set_xlabel("link goodput (Gbit/s, measured)")
    ax.set_ylabel(f"speedup over plain Gloo at {size >> 20} MiB")
    ax.set_title("measured (markers) and model (thin lines), 1 core per node")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_directory(directory: Path) -> list[Path]:
    """Both plots of the reports in ``directory``, written beside them; the model's lines
    too when ``directory/kernels.json`` holds calibrated kernel rates."""
    reports = load(directory)
    rates = directory / "kernels.json"
    kernels = json.loads(rates.read_text()) if rates.exists() else None
    return [plot_time_vs_size(reports, directory / "time_vs_size.png"),
            plot_speedup_vs_bandwidth(reports, directory / "speedup_vs_bandwidth.png", kernels=kernels)]


if __name__ == "__main__":
    for written in plot_directory(Path(sys.argv[1])):
        print(written)
