"""How far pipelining overlaps kernels and wire: the split of each large 1-bit call, from the network suite's reports.

Usage (from the repository root; no root needed):
    .venv/bin/python bench/network/overlap.py bench/results/network/pipelined_*.json \
        > bench/results/network/overlap.txt

Each report must hold ``1bit-wire``, ``1bit-serial`` and ``1bit`` side by side (``scenario.py
--methods plain,1bit-wire,1bit-serial,1bit``). For every row:
1. wire W: the time of ``1bit-wire``, the same transport operations on the same bytes
   with no kernel;
2. kernels K: what the one-piece call adds to it, ``1bit-serial`` - W (its kernels and
   Python, none of which overlaps the wire);
3. the pipelined call T (``1bit``, in ``pieces``) against max(K, W), the best overlap can
   do, and the share of min(K, W) it hid: (K + W - T) / min(K, W);
4. where OUT/kernels.json is beside the reports, the model's prediction of T.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from compcoll.bench.model import predict  # noqa: E402
from compcoll.bench.model_cli import emulated_cluster  # noqa: E402

NEEDED = ("1bit-wire", "1bit-serial", "1bit")


def split(report: dict, kernels: dict | None = None) -> list[dict]:
    """Steps 1-4 for every row of ``report`` (times in ms)."""
    out = []
    for row in report["rows"]:
        if not all(name in row for name in NEEDED):
            continue
        wire, serial, piped = (row[name]["time_us"] / 1e3 for name in NEEDED)
        work = max(0.0, serial - wire)
        pieces = row["1bit"].get("pieces") or 1
        model = (predict(emulated_cluster(report, kernels), row["size"], "1bit", pieces).total * 1e3
                 if kernels else None)
        out.append({
            "size": row["size"], "pieces": pieces,
            "plain_ms": row["plain"]["time_us"] / 1e3 if "plain" in row else None,
            "wire_ms": wire, "kernels_ms": work, "serial_ms": serial, "pipelined_ms": piped,
            "bound_ratio": piped / max(work, wire),
            "hidden": (work + wire - piped) / min(work, wire) if min(work, wire) > 0 else None,
            "model_ms": model,
        })
    return out


def table(paths: list[Path]) -> str:
    """One line per report row: the split, the overlap, the speedup over plain and the model."""
    lines = [f"# {'report':>28} {'size(B)':>10} {'P':>2} | {'wire ms':>8} {'kernels ms':>10} {'serial ms':>9} "
             f"{'piped ms':>8} | {'T/max':>5} {'hidden':>6} | {'plain ms':>8} {'speedup':>7} | {'model ms':>8}"]
    for path in paths:
        report = json.loads(path.read_text())
        known = path.parent / "kernels.json"
        kernels = json.loads(known.read_text()) if known.exists() else None
        for r in split(report, kernels):
            hidden = "-" if r["hidden"] is None else f"{r['hidden']:.0%}"
            plain = "-" if r["plain_ms"] is None else f"{r['plain_ms']:.1f}"
            speedup = "-" if r["plain_ms"] is None else f"{r['plain_ms'] / r['pipelined_ms']:.1f}x"
            model = "-" if r["model_ms"] is None else f"{r['model_ms']:.1f}"
            lines.append(
                f"  {path.stem:>28} {r['size']:>10} {r['pieces']:>2} | {r['wire_ms']:>8.1f} {r['kernels_ms']:>10.1f} "
                f"{r['serial_ms']:>9.1f} {r['pipelined_ms']:>8.1f} | {r['bound_ratio']:>5.2f} {hidden:>6} | "
                f"{plain:>8} {speedup:>7} | {model:>8}"
            )
    return "\n".join(lines)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("reports", nargs="+", type=Path, help="scenario JSON reports")
    print(table(p.parse_args().reports))
    return 0


if __name__ == "__main__":
    sys.exit(main())
