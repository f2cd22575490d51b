"""What an in-process world of many ranks costs on this machine: seconds per step and memory, one run.

Usage (from the repository root):
    .venv/bin/python bench/scaling/cost.py --ranks 256 --out bench/results/scaling_cost

1. ``compressed_allreduce`` of ``--numel`` float32 on ``local_world(n)``: every rank on
   its own thread, ``--steps`` calls; seconds per call (median over calls, the slowest
   rank's).
2. DDP training of a ``--hidden`` MLP (about 100k parameters at 256) with ``onebit_hook``
   on torch's multi-threaded process group, n threads, ``--steps`` steps after 2 warm-up
   steps; seconds per step (median).
3. Peak resident memory of the process after each part (``ru_maxrss``).
Writes OUT.txt and OUT.json.
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import compcoll  # noqa: E402
import compcoll.ddp  # noqa: E402
from compcoll.launcher import run_threads  # noqa: E402
from tests.ddp.threaded_group import run_threaded_group  # noqa: E402


def peak_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def allreduce_seconds(n: int, numel: int, steps: int) -> list[float]:
    """Per call, the slowest rank's seconds for compressed_allreduce of ``numel`` floats on n threads."""
    times = [[0.0] * steps for _ in range(n)]

    def rank(comm) -> None:
        x = torch.randn(numel, generator=torch.Generator().manual_seed(comm.rank))
        full = compcoll.padded_numel(numel, n)
        we, se = torch.zeros(full), torch.zeros(full // n)
        for step in range(steps):
            start = time.perf_counter()
            compcoll.compressed_allreduce(x, we, se, comm)
            times[comm.rank][step] = time.perf_counter() - start

    run_threads(rank, n, timeout=1800)
    return [max(times[r][step] for r in range(n)) for step in range(steps)]


def ddp_seconds(n: int, hidden: int, steps: int) -> tuple[list[float], int]:
    """Per step, rank 0's seconds of DDP training with onebit_hook on n threads of torch's threaded group."""
    torch.manual_seed(0)
    base = torch.nn.Sequential(torch.nn.Linear(64, hidden), torch.nn.Tanh(), torch.nn.Linear(hidden, hidden),
                               torch.nn.Tanh(), torch.nn.Linear(hidden, 10))
    state_dict = base.state_dict()
    out: list[float] = []

    def body(comm) -> None:
        model = torch.nn.Sequential(torch.nn.Linear(64, hidden), torch.nn.Tanh(), torch.nn.Linear(hidden, hidden),
                                    torch.nn.Tanh(), torch.nn.Linear(hidden, 10))
        model.load_state_dict(state_dict)
        ddp = torch.nn.parallel.DistributedDataParallel(model)
        ddp.register_comm_hook(compcoll.ddp.OneBitState(start_iter=1, min_compress_numel=0),
                               compcoll.ddp.onebit_hook)
        opt = torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9)
        gen = torch.Generator().manual_seed(comm.rank)
        for step in range(steps + 2):
            x, y = torch.randn(4, 64, generator=gen), torch.randint(0, 10, (4,), generator=gen)
            start = time.perf_counter()
            opt.zero_grad()
            torch.nn.functional.cross_entropy(ddp(x), y).backward()
            opt.step()
            if comm.rank == 0 and step >= 2:
                out.append(time.perf_counter() - start)

    run_threaded_group(body, n, timeout=3600)
    return out, sum(p.numel() for p in base.parameters())


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ranks", type=int, default=256)
    p.add_argument("--numel", type=int, default=1 << 20)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args()
    before = peak_mib()
    calls = allreduce_seconds(args.ranks, args.numel, args.steps)
    after_allreduce = peak_mib()
    steps, params = ddp_seconds(args.ranks, args.hidden, args.steps)
    after_ddp = peak_mib()
    result = {"command": " ".join(sys.argv), "ranks": args.ranks, "numel": args.numel, "params": params,
              "allreduce_s": calls, "ddp_step_s": steps, "peak_mib": {"start": before, "allreduce": after_allreduce,
                                                                      "ddp": after_ddp}}
    table = "\n".join([
        f"# {args.ranks} ranks in one process on this machine; medians of {args.steps}",
        f"compressed_allreduce of {args.numel} float32 on local_world: {statistics.median(calls):.2f} s per call "
        f"(slowest rank); peak memory {after_allreduce:.0f} MiB (from {before:.0f})",
        f"DDP + onebit_hook, {params}-parameter MLP, torch's threaded group: {statistics.median(steps):.2f} s per "
        f"step; peak memory {after_ddp:.0f} MiB",
    ])
    print(table)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.with_suffix(".txt").write_text(table + "\n")
    args.out.with_suffix(".json").write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
