"""Print the CUDA kernel launches, tensor wraps, host waits and torch operators of one call of each protocol, no GPU.

Usage:
    python scripts/cuda_launches.py [--numel 1048576] [--json]

The calls run at one rank (``SingleComm``) on meta tensors, which take the CUDA path with
every launch and host wait counted and none run (``kernels.launch.TRACED``); the counts
are those ``bench/gpu_suite.py`` reads on a GPU. ``torch`` counts the torch operators with
device work (copies, arithmetic, fills; at one rank the transport's copies among them).
``COMPCOLL_CUDA_LAUNCHER=numba`` counts numba's dispatcher's tensor wraps. ``--json`` prints
one object keyed by protocol.
"""

from __future__ import annotations

import argparse
import json

import torch

from compcoll import SingleComm
from compcoll.bench.launches import call_counts


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--numel", type=int, default=1 << 20, help="float32 elements of the tensor (default 1048576)")
    p.add_argument("--json", action="store_true", help="print one JSON object keyed by protocol")
    args = p.parse_args()
    counts = call_counts(torch.empty(args.numel, device="meta"), SingleComm())
    if args.json:
        print(json.dumps(counts))
        return 0
    print(f"one call at 1 rank, {args.numel} float32 elements (meta tensors: counted, not run)")
    print(f"{'protocol':<16}{'launches':>10}{'wraps':>8}{'waits':>8}{'torch':>8}")
    for name, c in counts.items():
        print(f"{name:<16}{c['launches']:>10}{c['wraps']:>8}{c['waits']:>8}{c['torch']:>8}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
