"""Nsight Compute's reading of every kernel bench/gpu_suite.py times: how far each is from the memory's peak, and why.

Usage (on a machine with an NVIDIA GPU and ncu; ``scripts/gpu_run.sh`` runs it where it finds ncu):
    ncu --clock-control none --profile-from-start off --section SpeedOfLight --section Occupancy \\
        --section LaunchStats --section WarpStateStats --csv --page details \\
        python bench/gpu_ncu.py --numel 67108864 --names ncu_names.json > ncu.csv
    python bench/gpu_ncu.py --summary ncu.csv --names ncu_names.json

Under ncu:
1. Build the tensors of ``gpu_suite.flat_kernels`` (the one-scale form's kernels and the DDP hook's default form's)
   at ``--numel`` float32 elements and call each kernel once, so that it is compiled and its memory allocated.
2. Wait for the device, then call each kernel once more between ``cudaProfilerStart`` and ``cudaProfilerStop``:
   ncu, told ``--profile-from-start off``, profiles these calls alone, in that order.
3. Write ``--names``: each kernel's name in the suite and the launches its call made (``kernels.launch.COUNTS``),
   in the order of the calls, so that ncu's rows can be told apart.
With ``--summary``: one line per profiled launch, its suite name beside ncu's kernel name, with its duration, DRAM
and compute throughput as percentages of peak, achieved occupancy, registers per thread and the warp cycles per
issued instruction (the latency each warp waits between instructions).
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from gpu_suite import flat_kernels  # noqa: E402

from compcoll.kernels.launch import COUNTS  # noqa: E402

METRICS = {"Duration": "duration", "DRAM Throughput": "dram %", "Compute (SM) Throughput": "sm %",
           "Achieved Occupancy": "occupancy %", "Registers Per Thread": "registers",
           "Warp Cycles Per Issued Instruction": "cycles/issue"}
"""ncu's metrics (details page, the sections of the usage line) the summary prints, and their columns."""


def profiled_calls(numel: int, device: str) -> list[tuple[str, int]]:
    """Steps 1-2: every kernel of ``gpu_suite.flat_kernels`` on ``numel`` elements of ``device``, once to warm it
    and once between the profiler's start and stop (elsewhere, with no profiler, only once: on meta tensors the
    launches are counted and none run, the counts a GPU's). Returns each kernel's suite name and the launches of
    its profiled call."""
    gen = None if device == "meta" else torch.Generator(device=device).manual_seed(numel)
    x = torch.randn(numel, device=device, generator=gen)
    err = torch.randn(numel, device=device, generator=gen) * 0.1
    bits = torch.empty(numel // 8, dtype=torch.uint8, device=device)
    out = torch.empty(numel, device=device)
    kernels = flat_kernels(x, err, bits, out)
    on_gpu = torch.device(device).type == "cuda"
    if on_gpu:
        for fn, _, _ in kernels.values():
            fn()
        torch.cuda.synchronize()
        torch.cuda.profiler.start()
    launched = []
    for name, (fn, _, _) in kernels.items():
        COUNTS.reset()
        fn()
        launched.append((name, COUNTS.launches))
    if on_gpu:
        torch.cuda.synchronize()
        torch.cuda.profiler.stop()
    return launched


def summary(report: Path, names: list[tuple[str, int]]) -> list[str]:
    """Lines of the ``--summary`` table from ncu's CSV ``report`` (its details page: a row per metric of each
    profiled launch, ``ID`` counting the launches from 0) and ``names`` (step 3's file), the suite's names given to
    the launches in order. A report whose launches do not add up to ``names``' says so first."""
    text = report.read_text()
    rows = csv.DictReader(line for line in text.splitlines() if line.startswith('"'))
    launches: dict[int, dict[str, str]] = {}
    for row in rows:
        if not row.get("ID", "").isdigit():
            continue
        seen = launches.setdefault(int(row["ID"]), {"kernel": row.get("Kernel Name", "?")})
        metric, unit = row.get("Metric Name"), row.get("Metric Unit", "")
        if metric in METRICS:
            seen[metric] = row.get("Metric Value", "") + (f" {unit}" if metric == "Duration" else "")
    owners = [name for name, count in names for _ in range(count)]
    lines = []
    if len(owners) != len(launches):
        lines.append(f"# {len(launches)} launches in the report, {len(owners)} in the suite's calls: names unsure")
    lines.append(f"{'suite kernel':30s} {'ncu kernel':40s} " + " ".join(f"{c:>12s}" for c in METRICS.values()))
    for index, (launch, seen) in enumerate(sorted(launches.items())):
        owner = owners[index] if index < len(owners) else "?"
        kernel = seen["kernel"].split("(")[0][-40:]
        lines.append(f"{owner:30s} {kernel:40s} " + " ".join(f"{seen.get(m, '-'):>12s}" for m in METRICS))
    return lines


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--numel", type=int, default=1 << 26)
    p.add_argument("--names", type=Path, required=True, help="the launches' names in the suite (JSON), written or read")
    p.add_argument("--summary", type=Path, help="ncu's CSV report to summarise (no GPU needed)")
    p.add_argument("--device", default="cuda", help="where the kernels run (meta: counted, not run; nothing profiled)")
    args = p.parse_args()
    if args.summary:
        print("\n".join(summary(args.summary, json.loads(args.names.read_text()))))
        return 0
    if args.device == "cuda" and not torch.cuda.is_available():
        print("bench/gpu_ncu.py: no CUDA GPU here", file=sys.stderr)
        return 2
    args.names.write_text(json.dumps(profiled_calls(args.numel, args.device)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
