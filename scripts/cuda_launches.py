"""Print the CUDA kernel launches, tensor wraps, host waits and torch operators of one call of each protocol, no GPU.

Usage:
    python scripts/cuda_launches.py [--numel 1048576] [--json] [--time [--runs 9] [--calls 200]] [--python]
        [--on-device]
    python scripts/cuda_launches.py --ranks 64 [--ranks-per-node 8] [--on-device] [--numel N] [--json]

The calls run at one rank (``SingleComm``, its agreement rounds on host numbers, as over MPI or
Gloo) on meta tensors, which take the CUDA path with every launch and host wait counted and
none run (``kernels.launch.TRACED``); the counts are those ``bench/gpu_suite.py`` reads on a
GPU, where ``SingleComm`` runs its rounds on the device (``--on-device``'s counts; the launches
and waits are the same). ``torch`` counts the torch operators with
device work (copies, arithmetic, fills; at one rank the transport's copies among them),
``allocs`` the allocations of device memory (the result's, where no ``out`` is given).
``COMPCOLL_CUDA_LAUNCHER=numba`` counts numba's dispatcher's tensor wraps. ``--json`` prints
one object keyed by protocol. ``--time`` adds each call's host microseconds on meta tensors
(``host_us``: the CUDA path's Python with nothing launched, median of 9 means of 200 calls),
a proxy for its host overhead on a GPU; compare versions side by side on one machine. ``--python`` adds the calls
of compcoll's own Python functions in a steady call (``python``: a count, the same on any machine, so versions
compare exactly where ``--time`` is noisy).

``--on-device`` runs the agreement rounds on the device, as NCCL's do (``Communicator.agrees_on_device``): the
counts, ``--time`` and ``--python`` of NCCL's path, at one rank or in a world.

``--ranks N`` counts one rank's launches, wraps and waits in an in-process world of N ranks
(``--ranks-per-node``, default 1, for the hierarchical forms' nodes) on meta tensors
(``compcoll.bench.launches.world_counts``): what each rank of an N-rank job makes, which
should not grow with N (the torch operators and allocations are not counted there).
"""

from __future__ import annotations

import argparse
import json

import torch

from compcoll import SingleComm
from compcoll.bench.launches import call_counts, host_microseconds, python_calls, world_counts


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--numel", type=int, default=1 << 20, help="float32 elements of the tensor (default 1048576)")
    p.add_argument("--json", action="store_true", help="print one JSON object keyed by protocol")
    p.add_argument("--time", action="store_true", help="add each call's host microseconds on meta tensors")
    p.add_argument("--runs", type=int, default=9, help="--time: runs whose median is given (default 9)")
    p.add_argument("--calls", type=int, default=200, help="--time: calls in a row per run (default 200)")
    p.add_argument("--python", action="store_true", help="add the calls of compcoll's own Python functions a call")
    p.add_argument("--ranks", type=int, default=1, help="ranks of an in-process world (default 1)")
    p.add_argument("--ranks-per-node", type=int, default=1, help="--ranks: ranks a node (default 1)")
    p.add_argument("--on-device", action="store_true",
                   help="agreement rounds on the device, as over NCCL (Communicator.agrees_on_device)")
    args = p.parse_args()
    if args.ranks < 1 or args.ranks_per_node < 1 or args.ranks % args.ranks_per_node:
        p.error("--ranks must be a positive multiple of --ranks-per-node")
    if args.ranks > 1 and (args.time or args.python):
        p.error("--time and --python measure one rank; leave out --ranks")
    x = torch.empty(args.numel, device="meta")
    if args.ranks > 1:
        counts = world_counts(args.numel, args.ranks, args.ranks_per_node, on_device=args.on_device)
    else:
        counts = call_counts(x, one_rank(args.on_device))
    if args.time:
        for name, us in host_microseconds(x, one_rank(args.on_device), args.runs, args.calls).items():
            counts[name]["host_us"] = round(us, 1)
    if args.python:
        for name, own in python_calls(x, one_rank(args.on_device)).items():
            counts[name]["python"] = round(own, 1)
    if args.json:
        print(json.dumps(counts))
        return 0
    where = (f"a rank of {args.ranks}, {args.ranks_per_node} a node" if args.ranks > 1 else "1 rank")
    where += ", agreement rounds on the device" if args.on_device else ""
    print(f"one call at {where}, {args.numel} float32 elements (meta tensors: counted, not run)")
    timed = (f"{'host us':>10}" if args.time else "") + (f"{'python':>8}" if args.python else "")
    print(f"{'protocol':<24}{'launches':>10}{'wraps':>8}{'waits':>8}{'torch':>8}{'allocs':>8}{timed}")
    for name, c in counts.items():
        print(f"{name:<24}{c['launches']:>10}{c['wraps']:>8}{c['waits']:>8}{c.get('torch', '-'):>8}"
              f"{c.get('allocations', '-'):>8}" + (f"{c['host_us']:>10.1f}" if args.time else "")
              + (f"{c['python']:>8.0f}" if args.python else ""))
    return 0


def one_rank(on_device: bool) -> SingleComm:
    """A one-rank communicator, its agreement rounds on the device where ``on_device`` (NCCL's path, and
    ``SingleComm``'s own), else on host numbers (MPI's and Gloo's)."""
    comm = SingleComm()
    comm.agrees_on_device = on_device
    return comm


if __name__ == "__main__":
    raise SystemExit(main())
