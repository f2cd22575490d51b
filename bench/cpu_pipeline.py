"""Single-process compressed_allreduce on CPU: fused kernels vs DeepSpeed's torch-ops pipeline vs a copy.

Usage: ``python bench/cpu_pipeline.py [--numel 16777216] [--runs 9] [--json bench/results/cpu_pipeline.json]``

Side by side in one run, interleaved, median of ``--runs``:
1. compcoll.compressed_allreduce on a 1-rank communicator (every codec step runs; the
   collectives are copies), writing into a preallocated output;
2. the same algorithm written as DeepSpeed's NcclBackend.compressed_allreduce is, with
   torch ops and numpy.packbits / unpackbits standing in for cupy's;
3. one memory copy of the tensor (``out.copy_(x)``), the unit the others are expressed in;
4. each fused kernel alone, with the bytes it must move and its bandwidth beside the copy's.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import numpy as np
import torch

import compcoll
from compcoll import codecs


def deepspeed_style(x: torch.Tensor, worker_error: torch.Tensor, server_error: torch.Tensor) -> torch.Tensor:
    """DeepSpeed's compressed_allreduce for one rank, op for op, numpy in place of cupy."""
    size = 1
    buffer_m = torch.cat([x.flatten(), torch.zeros(worker_error.numel() - x.numel())])
    buffer_m.add_(worker_error)
    worker_scale = torch.linalg.norm(buffer_m) / np.sqrt(buffer_m.numel())
    worker_error.set_(buffer_m - worker_scale * buffer_m.sign().add_(1).bool().float().add_(-0.5).mul_(2.0))
    packed = np.packbits(buffer_m.sign_().add_(1).bool().numpy())
    recvbuf_sign = packed.reshape(size, -1).copy()
    recvbuf_scale = [worker_scale.reshape(1).clone()]
    unpacked = torch.from_numpy(np.unpackbits(recvbuf_sign.flatten()).reshape(size, -1)).float()
    unpacked = unpacked.add_(-0.5).mul_(2.0)
    compensated = unpacked.mul_(torch.stack(recvbuf_scale).mul_(1 / size)).sum(0)
    compensated.add_(server_error)
    server_scale = torch.linalg.norm(compensated) / np.sqrt(compensated.numel())
    server_error.set_(compensated - server_scale * compensated.sign().add_(1).bool().float().add_(-0.5).mul_(2.0))
    server_packed = np.packbits(compensated.sign_().add_(1).bool().numpy())
    recv_server = server_packed.reshape(size, -1).copy()
    server_unpacked = torch.from_numpy(np.unpackbits(recv_server.flatten()).reshape(size, -1)).float()
    server_unpacked = server_unpacked.add_(-0.5).mul_(2.0)
    return server_unpacked.mul_(server_scale.reshape(1, 1)).flatten()[: x.numel()].reshape(x.shape)


def median_times(cases: dict, runs: int) -> dict[str, float]:
    """Median seconds of each case, the cases interleaved run by run after one warmup each."""
    for fn in cases.values():
        fn()
    times: dict[str, list[float]] = {name: [] for name in cases}
    for _ in range(runs):
        for name, fn in cases.items():
            start = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - start)
    return {name: statistics.median(t) for name, t in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--numel", type=int, default=16 * 2**20)
    parser.add_argument("--runs", type=int, default=9)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()

    comm = compcoll.SingleComm()
    n = args.numel
    full = compcoll.padded_numel(n, 1)
    x = torch.randn(n, generator=torch.Generator().manual_seed(0))
    out = torch.empty_like(x)
    we, se = torch.zeros(full), torch.zeros(full)
    ds_we, ds_se = torch.zeros(full), torch.zeros(full)
    bits = torch.empty(full // 8, dtype=torch.uint8)
    rows = torch.empty(1, full // 8, dtype=torch.uint8)
    weights = torch.ones(1)
    scale = codecs.scale_from(codecs.compensated_sum(x, we), full, "l2")

    pipeline = median_times({
        "compcoll": lambda: compcoll.compressed_allreduce(x, we, se, comm, out=out),
        "deepspeed_style": lambda: deepspeed_style(x, ds_we, ds_se),
        "copy": lambda: out.copy_(x),
    }, args.runs)
    kernels = median_times({
        "compensated_sum": lambda: codecs.compensated_sum(x, we),
        "compensate_encode": lambda: codecs.compensate_encode(x, we, scale, bits),
        "accumulate_signs": lambda: codecs.accumulate_signs(rows, weights, se, se, full),
        "decode": lambda: codecs.decode(rows, torch.ones(1), out),
        "copy": lambda: out.copy_(x),
    }, args.runs)
    moved = {  # bytes each step must read + write
        "compensated_sum": 8 * n,
        "compensate_encode": 12 * n + n // 8,
        "accumulate_signs": 8 * n + n // 8,
        "decode": 4 * n + n // 8,
        "copy": 8 * n,
    }
    copy_bw = moved["copy"] / kernels["copy"]
    report = {
        "numel": n,
        "threads": {"torch": torch.get_num_threads(), "numba": __import__("numba").get_num_threads()},
        "runs": args.runs,
        "pipeline_ms": {k: v * 1e3 for k, v in pipeline.items()},
        "speedup_vs_deepspeed_style": pipeline["deepspeed_style"] / pipeline["compcoll"],
        "compcoll_in_copies": pipeline["compcoll"] / pipeline["copy"],
        "deepspeed_style_in_copies": pipeline["deepspeed_style"] / pipeline["copy"],
        "kernels": {
            k: {"ms": v * 1e3, "GBps": moved[k] / v / 1e9, "of_copy_bw": moved[k] / v / copy_bw}
            for k, v in kernels.items()
        },
    }
    print(f"compressed_allreduce, 1 rank, {n} float32 elements, median of {args.runs} interleaved runs")
    for k, v in report["pipeline_ms"].items():
        print(f"  {k:<16} {v:9.2f} ms  = {v / report['pipeline_ms']['copy']:6.2f} copies")
    print(f"  speedup over the DeepSpeed-style pipeline: {report['speedup_vs_deepspeed_style']:.1f}x")
    print("kernel              ms      GB/s   of copy bandwidth")
    for k, v in report["kernels"].items():
        print(f"  {k:<17} {v['ms']:7.2f} {v['GBps']:8.2f} {v['of_copy_bw']:8.2f}")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
