"""PNG plots of the network suite's JSON: time vs size per method, and speedup vs link bandwidth.

Usage: ``python bench/network/plot.py bench/results/network``
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

SPEEDUP_SIZE = 64 << 20


def load(directory: Path) -> list[dict]:
    """Every scenario report of ``directory``, sorted by layout, rate and backend."""
    reports = [json.loads(p.read_text()) for p in sorted(directory.glob("*_*_*x*.json"))]
    return sorted(reports, key=lambda r: (r["nodes"], r["ranks_per_node"], r["link_goodput_gbit"], r["backend"]))


def _scenario(report: dict) -> str:
    return f"{report['nodes']}x{report['ranks_per_node']} @ {report['rate']}"


def plot_time_vs_size(reports: list[dict], path: Path) -> Path:
    """One panel per scenario: time of one call against size, a line per backend and method."""
    scenarios = list(dict.fromkeys(_scenario(r) for r in reports))
    fig, axes = plt.subplots(1, len(scenarios), figsize=(4.2 * len(scenarios), 4), squeeze=False, sharey=True)
    for ax, scenario in zip(axes[0], scenarios):
        for report in (r for r in reports if _scenario(r) == scenario):
            for method in report["methods"]:
                sizes = [row["size"] / (1 << 20) for row in report["rows"]]
                times = [row[method]["time_us"] / 1e3 for row in report["rows"]]
                style = "--" if report["backend"] == "mpi" else "-"
                ax.loglog(sizes, times, style, marker="o", ms=3, label=f"{method} ({report['backend']})")
        ax.set_title(scenario)
        ax.set_xlabel("size (MiB of float32)")
        ax.grid(True, which="both", alpha=0.3)
    axes[0][0].set_ylabel("time per allreduce (ms, median)")
    axes[0][-1].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_speedup_vs_bandwidth(reports: list[dict], path: Path, size: int = SPEEDUP_SIZE) -> Path:
    """Speedup over plain Gloo allreduce at ``size`` bytes against the measured link goodput,
    a line per layout and method (Gloo jobs)."""
    fig, ax = plt.subplots(figsize=(6, 4))
    gloo = [r for r in reports if r["backend"] == "gloo"]
    for layout in dict.fromkeys((r["nodes"], r["ranks_per_node"]) for r in gloo):
        runs = [r for r in gloo if (r["nodes"], r["ranks_per_node"]) == layout]
        for method in [m for m in runs[0]["methods"] if m != "plain"]:
            points = [(r["link_goodput_gbit"], row[method]["speedup"]) for r in runs for row in r["rows"]
                      if row["size"] == size]
            ax.semilogx(*zip(*points), marker="o", label=f"{method}, {layout[0]}x{layout[1]}")
    ax.axhline(1, color="gray", lw=0.8, label="plain Gloo")
    ax.set_xlabel("link goodput (Gbit/s, measured)")
    ax.set_ylabel(f"speedup over plain Gloo at {size >> 20} MiB")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_directory(directory: Path) -> list[Path]:
    """Both plots of the reports in ``directory``, written beside them."""
    reports = load(directory)
    return [plot_time_vs_size(reports, directory / "time_vs_size.png"),
            plot_speedup_vs_bandwidth(reports, directory / "speedup_vs_bandwidth.png")]


if __name__ == "__main__":
    for written in plot_directory(Path(sys.argv[1])):
        print(written)
