"""GPU suite: fused CUDA kernels vs a device copy and vs the DeepSpeed-style path (torch ops + cupy.packbits), one run.

Usage (on a machine with an NVIDIA GPU, torch with CUDA, numba-cuda and cupy):
    python bench/gpu_suite.py --out bench/results/gpu_kernels

For each size (float32 elements), medians of ``--runs`` timings (CUDA events) of:
1. a device-to-device copy of the tensor (reads and writes 4 bytes per element): the
   memory bandwidth the kernels are compared with;
2. every fused kernel (the DDP hook's default form's too, a scale per 64 elements: ``block_kernels``), with the
   bytes it must move (e.g. compensate + encode reads the input and the error, writes the error and the bits:
   12.125 bytes per element), as GB/s and as a fraction of the copy's, both from the device's time queued
   (``compcoll.bench.clocks.QueuedClock``: the kernel's own time, as inside a busy training step), beside its time
   from an idle device (the host's launch time included: the clock of the runs before 2026-11-29); the
   accumulate also without the last block that ends its sum (fence, block count, tree: "lanes only"), to tell the
   two costs apart, and the server's accumulates of a 16-rank call (``served_kernels``: 16 rows of a 16th of the
   tensor each, signs and 4-bit levels, the block weights from a table and from the frames
   (``codecs.accumulate_framed``: the block forms' server since 2026-12-05), the weights from the frame heads
   (Birder's exchanges); the levels' decode; the hierarchical allgather's average of 4 groups of 4)
   (``flat_kernels``, which also run on CPU tensors: tests/bench/test_gpu_scripts.py);
3. the worker step both ways, on both clocks: fused (sum of squares + compensate/encode) against the
   DeepSpeed-style torch ops (add, norm, sign, error update) + cupy.packbits;
4. compressed_allreduce end to end on one rank (SingleComm), CUDA tensors, with one scale and with a scale per
   ``BLOCK_SIZE`` elements (the DDP hook's default), each also as host time;
5. the server step (``serve``: accumulate, scale, encode, frame) on the device and on the host:
   the host's time to queue it is far below the device's when nothing in it waits for the device;
6. the host time of one compressed_allreduce call (from an idle device to its return; and the host's own, less the
   time its wait took: ``compcoll.bench.clocks.own_host_seconds``), and the
   kernel launches, tensor wraps and host waits (``kernels.launch.COUNTS``) and torch operators of one call of each
   protocol: gather-scatter, allgather, the compensated hierarchical form, Birder's, both flat protocols with
   block scales (``compcoll.bench.launches``, which ``scripts/cuda_launches.py`` runs on meta tensors).
Each launcher (``--launchers``, default ``bound,numba``: ``kernels.launch``) measures 1-6 in the
same run, so their ratios are side by side, and its table ends with issue 39's three aims read from them
(``aims``). Writes OUT.txt and OUT.json with the GPU's name and
the command after every size, so a run cut short by its time limit keeps what it measured.
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import sys
from pathlib import Path

import torch

import compcoll
from compcoll import codecs
from compcoll.algorithms.server import serve
from compcoll.bench.clocks import QueuedClock, host_seconds, idle_seconds, own_host_seconds, timed
from compcoll.bench.launches import call_counts
from compcoll.ddp.onebit import BLOCK_SIZE
from compcoll.kernels.launch import use_launcher
from compcoll.spec import STAGES, stream_key
from compcoll.workspace import Workspace


def deepspeed_style_worker(x: torch.Tensor, err: torch.Tensor):
    """The worker step as DeepSpeed writes it: torch ops for compensation and scale, cupy.packbits for the signs."""
    import cupy

    buf = x + err
    scale = buf.norm() / math.sqrt(buf.numel())
    sign = torch.where(buf >= 0, 1.0, -1.0)
    err.copy_(buf - scale * sign)
    return cupy.packbits(cupy.asarray((sign > 0).to(torch.uint8)))


def block_kernels(x: torch.Tensor, err: torch.Tensor, out: torch.Tensor) -> dict[str, tuple]:
    """The DDP hook's default form's kernels (a scale per ``BLOCK_SIZE`` elements), each step of a one-row call in
    turn on one framed wire row: name -> (function, bytes it moves per element, None)."""
    n, b = x.numel(), BLOCK_SIZE
    m = -(-n // b)
    sums = torch.empty(m, dtype=torch.float64, device=x.device)
    frame = torch.empty(1, codecs.SCALE_BYTES + m + n // 8, dtype=torch.uint8, device=x.device)
    decoded, weights = torch.empty(m, device=x.device), torch.empty(m, device=x.device)
    signs = frame[:, codecs.SCALE_BYTES + m:]
    return {
        "block sums, per 64": (lambda: codecs.block_sums(x, err, b, "l2", 1, out=sums), 8 + 8 / b, None),
        "code block scales": (lambda: codecs.frame_scales(frame, sums, "l2", b, n, out=decoded), 13 / b, None),
        "encode, block scales": (lambda: codecs.encode_blocks(x, err, decoded, b, signs), 12.125 + 4 / b, None),
        "unframe block scales": (lambda: codecs.unframe_blocks(frame, m, 1, out=weights), 5 / b, None),
        "accumulate, block weights": (lambda: codecs.accumulate_blocks(signs, weights.view(1, m), b, None, out, n),
                                      4.125 + 4 / b, None),
        "accumulate, weights from the frame": (lambda: codecs.accumulate_framed(frame, m, 1, b, None, out, n),
                                               4.125 + 1 / b, None),
        "decode, block scales": (lambda: codecs.decode_framed_blocks(frame, m, b, out), 4.125 + 1 / b, None),
    }


SERVED = 16
"""Ranks of the server accumulates ``served_kernels`` times: a 16-rank call's on the same tensor (its chunk a 16th of
it, a sign row of the chunk from each rank)."""
LEVEL_BITS = 4
"""Bits an element of ``served_kernels``' level rows."""


def served_kernels(bits: torch.Tensor, out: torch.Tensor, numel: int) -> dict[str, tuple]:
    """The server's accumulates of a ``SERVED``-rank call on ``numel`` elements, one scale, a scale per
    ``BLOCK_SIZE`` elements and ``LEVEL_BITS``-bit levels: ``SERVED`` rows of a chunk (``numel`` / ``SERVED``, a
    multiple of 8) each, into ``out``; the levels' decode of those rows, and the hierarchical allgather's average of
    its groups (a square number of rows, as many groups as members): name -> (function, bytes it moves per element of
    the tensor, None)."""
    chunk = numel // (8 * SERVED) * 8
    rows = bits[:SERVED * chunk // 8].view(SERVED, -1)
    ones = torch.ones(SERVED, device=bits.device)
    block_weights = torch.ones(SERVED, -(-chunk // BLOCK_SIZE), device=bits.device)
    planes = torch.randint(0, 256, (SERVED, LEVEL_BITS * chunk // 8), dtype=torch.uint8, device=bits.device)
    nodes = math.isqrt(SERVED)
    node_weights = torch.ones(nodes, SERVED // nodes, device=bits.device)
    per_element = (SERVED * chunk / 8 + 4 * chunk) / numel
    per_row = -(-chunk // BLOCK_SIZE)
    coded = torch.zeros(SERVED, codecs.SCALE_BYTES + per_row + chunk // 8, dtype=torch.uint8, device=bits.device)
    coded[:, :codecs.SCALE_BYTES] = torch.ones(SERVED, 1, device=bits.device).view(torch.uint8)  # heads 1.0, codes 0
    coded[:, codecs.SCALE_BYTES + per_row:] = rows
    headed = torch.cat([coded[:, :codecs.SCALE_BYTES], rows], dim=1)
    return {
        f"accumulate signs ({SERVED} rows)": (
            lambda: codecs.accumulate_signs(rows, ones, None, out, chunk, read=False), per_element, None),
        f"accumulate, block weights ({SERVED} rows)": (
            lambda: codecs.accumulate_blocks(rows, block_weights, BLOCK_SIZE, None, out, chunk),
            per_element + 4 / BLOCK_SIZE, None),
        f"accumulate, block weights from the frames ({SERVED} rows)": (
            lambda: codecs.accumulate_framed(coded, per_row, SERVED, BLOCK_SIZE, None, out, chunk),
            per_element + 1 / BLOCK_SIZE, None),
        f"accumulate, weights from the heads ({SERVED} rows)": (
            lambda: codecs.accumulate_framed(headed, 0, SERVED, 0, None, out, chunk), per_element, None),
        f"accumulate levels ({SERVED} rows, {LEVEL_BITS} bits)": (
            lambda: codecs.accumulate_levels(planes, block_weights, BLOCK_SIZE, LEVEL_BITS, out, chunk),
            (SERVED * chunk * (LEVEL_BITS / 8 + 4 / BLOCK_SIZE) + 4 * chunk) / numel, None),
        f"decode levels ({SERVED} rows, {LEVEL_BITS} bits)": (
            lambda: codecs.decode_levels(planes, block_weights, BLOCK_SIZE, LEVEL_BITS, out, SERVED * chunk),
            SERVED * chunk * (LEVEL_BITS / 8 + 4 / BLOCK_SIZE + 4) / numel, None),
        f"accumulate groups ({nodes} of {SERVED // nodes} rows)": (
            lambda: codecs.accumulate_groups(rows, node_weights, out, nodes * chunk),
            (SERVED * chunk / 8 + 4 * nodes * chunk) / numel, None),
    }


def flat_kernels(x: torch.Tensor, err: torch.Tensor, bits: torch.Tensor, out: torch.Tensor) -> dict[str, tuple]:
    """The one-scale form's kernels on ``x`` and ``err`` (any device; ``bits`` holds x.numel() / 8 bytes, ``out``
    x.numel() floats): name -> (function, bytes it moves per element, the function with its sum read back to the host
    (a wait) or None), then the DDP hook's default form's (``block_kernels``), then a many-rank call's server
    accumulates (``served_kernels``)."""
    numel, dev = x.numel(), x.device
    rows, one = bits.view(1, -1), torch.ones(1, device=dev)
    scales = torch.ones(8, device=dev)
    wire = torch.empty(8, codecs.SCALE_BYTES + numel // 64, dtype=torch.uint8, device=dev)
    key = stream_key(1, 2, STAGES["node"], 0)
    lanes = torch.empty(codecs.lane_count(numel), dtype=torch.float64, device=dev)

    def accumulate(read: bool):
        return lambda: codecs.accumulate_signs(rows, one, None, out, numel, read=read)

    return {
        "sum of squares (x + err)": (lambda: codecs.compensated_sum(x, err, read=False), 8.0,
                                     lambda: codecs.compensated_sum(x, err)),
        "compensate + encode": (lambda: codecs.compensate_encode(x, err, 0.5, bits), 12.125, None),
        "accumulate signs (1 row)": (accumulate(False), 4.125, accumulate(True)),
        "accumulate, lanes only": (lambda: codecs.accumulate_lanes(rows, one, None, out, numel, lanes), 4.125, None),
        "decode": (lambda: codecs.decode(rows, one, out), 4.125, None),
        "row max |x|": (lambda: codecs.row_absmax(x, 8, numel), 4.0, None),
        "randomized encode": (lambda: codecs.randomized_encode(x, scales, key, 0, wire), 4.125, None),
        **block_kernels(x, err, out),
        **served_kernels(bits, out, numel),
    }


def fused_worker(x: torch.Tensor, err: torch.Tensor, bits: torch.Tensor, read: bool = False) -> None:
    """The fused worker step: the sum of squares (read back to the host where ``read``), then compensate + encode."""
    codecs.compensated_sum(x, err, read=read)
    codecs.compensate_encode(x, err, 0.5, bits)


def measure(numel: int, runs: int) -> dict:
    dev = torch.device("cuda")
    gen = torch.Generator(device=dev).manual_seed(numel)
    x = torch.randn(numel, device=dev, generator=gen)
    err = torch.randn(numel, device=dev, generator=gen) * 0.1
    bits = torch.empty(numel // 8, dtype=torch.uint8, device=dev)
    out = torch.empty(numel, device=dev)
    dst = torch.empty_like(x)
    one = torch.ones(1, device=dev)
    clocks = {"queued": QueuedClock(), "idle": idle_seconds}

    def both(fn, read=None) -> dict[str, float]:
        """fn's times on both clocks; ``read``, where given, is fn with its sum read back (a host wait), which the
        idle clock times, as before 2026-11-29. A function the queued clock refuses (it waits for the device)
        reads NaN there, and the run goes on."""
        times = {}
        for name, clock in clocks.items():
            try:
                times[name] = timed(read if read and name == "idle" else fn, runs, clock=clock)
            except RuntimeError as refused:
                print(f"{numel} elements: {refused}", file=sys.stderr)
                times[name] = math.nan
        return times

    copy = both(lambda: dst.copy_(x))
    copy_bw = 8 * numel / copy["queued"]
    kernels = flat_kernels(x, err, bits, out)
    result = {"numel": numel, "copy_s": copy["queued"], "copy_idle_s": copy["idle"], "copy_GBps": copy_bw / 1e9,
              "kernels": {}}
    for name, (fn, per_element, read) in kernels.items():
        seconds = both(fn, read)
        bandwidth = per_element * numel / seconds["queued"]
        result["kernels"][name] = {"s": seconds["queued"], "idle_s": seconds["idle"], "GBps": bandwidth / 1e9,
                                   "of_copy": bandwidth / copy_bw}
    fused = both(lambda: fused_worker(x, err, bits), lambda: fused_worker(x, err, bits, read=True))
    baseline = both(lambda: deepspeed_style_worker(x, err))
    result["worker_step"] = {"fused_s": fused["queued"], "deepspeed_style_s": baseline["queued"],
                             "speedup": baseline["queued"] / fused["queued"], "fused_idle_s": fused["idle"],
                             "deepspeed_style_idle_s": baseline["idle"],
                             "speedup_idle": baseline["idle"] / fused["idle"]}
    full = compcoll.padded_numel(numel, 1)
    we, se = torch.zeros(full, device=dev), torch.zeros(full, device=dev)
    comm = compcoll.SingleComm()
    flat = functools.partial(compcoll.compressed_allreduce, x, we, se, comm, out=out)
    result["compressed_allreduce_1rank_s"] = timed(flat, runs)
    result["compressed_allreduce_host_s"] = timed(flat, runs, clock=host_seconds)
    result["compressed_allreduce_own_host_s"] = timed(flat, runs, clock=own_host_seconds)
    blocks = functools.partial(compcoll.compressed_allreduce, x, we, se, comm, out=out, block_size=BLOCK_SIZE)
    result["blocks_1rank_s"] = timed(blocks, runs)
    result["blocks_host_s"] = timed(blocks, runs, clock=host_seconds)
    result["blocks_own_host_s"] = timed(blocks, runs, clock=own_host_seconds)
    result["counts"] = call_counts(x, comm, torch.cuda.synchronize)
    workspace = Workspace()

    def server() -> torch.Tensor:
        return serve(bits, one, se[:numel], comm, workspace)

    result["serve"] = {"device_s": timed(server, runs), "host_s": timed(server, runs, clock=host_seconds)}
    return result


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes", default="4096,1048576,16777216,67108864,268435456",
                   help="float32 elements, comma-separated")
    p.add_argument("--runs", type=int, default=20)
    p.add_argument("--launchers", default="bound,numba", help="kernels.launch launchers to measure, comma-separated")
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args()
    if not torch.cuda.is_available():
        print("no CUDA GPU here: run this on a machine with one", file=sys.stderr)
        return 2
    gpu = torch.cuda.get_device_name()
    results: dict[str, list[dict]] = {}
    for name in args.launchers.split(","):
        use_launcher(name)
        results[name] = []
        for size in args.sizes.split(","):
            results[name].append(measure(int(size), args.runs))
            table = write(results, args, gpu)
    print(table)
    return 0


HOST_AIM_S, COPY_AIM, WORKER_AIM = 100e-6, 0.5, 2.0
"""Issue 39's GPU aims: host time a ``compressed_allreduce`` call from ``HOST_SIZES``, kernels from
``KERNEL_FROM`` elements at a fraction of copy bandwidth, the fused worker step from ``WORKER_FROM`` elements this
many times the torch-ops peer's speed (queued)."""
HOST_SIZES, KERNEL_FROM, WORKER_FROM = (4096, 1 << 26), 1 << 24, 1 << 20


def aims(rows: list[dict]) -> list[str]:
    """Issue 39's three GPU aims read from one launcher's ``rows`` (``measure``'s results), a line each, with every
    figure that decides it, "met" or "not met" (or "not measured" where no size is in the aim's range).

    1. Host time a call (one scale, one rank): the range over the sizes from 4096 to 64M elements, met where the
       largest is at most ``HOST_AIM_S``; beside it the range of the host's own time (``own_host_seconds``: the
       call's wait for its sum out), where the rows have it (runs since 2026-12-06).
    2. Kernels from 16M elements: each kernel's smallest fraction of copy bandwidth there, the ones below
       ``COPY_AIM`` named, smallest first.
    3. The worker step from 1M elements: the range of its speed-up over the torch-ops peer, queued.
    """
    ranged = [r for r in rows if HOST_SIZES[0] <= r["numel"] <= HOST_SIZES[1]]
    host = [r["compressed_allreduce_host_s"] for r in ranged]
    own_host = [r["compressed_allreduce_own_host_s"] for r in ranged if "compressed_allreduce_own_host_s" in r]
    lowest: dict[str, float] = {}
    for r in rows:
        if r["numel"] >= KERNEL_FROM:
            for name, k in r["kernels"].items():
                lowest[name] = min(lowest.get(name, math.inf), k["of_copy"])
    below = sorted((v, name) for name, v in lowest.items() if not v >= COPY_AIM)
    worker = [r["worker_step"]["speedup"] for r in rows if r["numel"] >= WORKER_FROM]

    def verdict(values: list, met: bool) -> str:
        return "not measured" if not values else "met" if met else "not met"

    host_met, worker_met = max(host or [0]) <= HOST_AIM_S, min(worker or [0]) >= WORKER_AIM
    named = ", ".join(f"{name} {v:.2f}" for v, name in below) or "none"
    return [
        f"# aim: host time a call <= {1e6 * HOST_AIM_S:.0f} us from {HOST_SIZES[0]} to {HOST_SIZES[1]} elements: "
        + (f"{1e6 * min(host):.1f}-{1e6 * max(host):.1f} us, " if host else "")
        + (f"the host's own (its wait's time out) {1e6 * min(own_host):.1f}-{1e6 * max(own_host):.1f} us, "
           if own_host else "") + verdict(host, host_met),
        f"# aim: kernels >= {COPY_AIM:.2f} of copy from {KERNEL_FROM} elements: "
        + (f"{len(lowest) - len(below)} of {len(lowest)} kernels; below: {named}, " if lowest else "")
        + verdict(list(lowest), not below),
        f"# aim: worker step >= {WORKER_AIM:.1f}x the torch-ops peer from {WORKER_FROM} elements: "
        + (f"{min(worker):.2f}-{max(worker):.2f}x, " if worker else "") + verdict(worker, worker_met),
    ]


def own(row: dict, call: str) -> str:
    """The host's own time of ``call`` ("compressed_allreduce" or "blocks") in ``row`` (``own_host_seconds``), or
    that the row's run did not measure it (before 2026-12-06)."""
    seconds = row.get(f"{call}_own_host_s")
    return "own: not measured" if seconds is None else f"own {1e6 * seconds:.1f} us"


def write(results: dict[str, list[dict]], args: argparse.Namespace, gpu: str) -> str:
    """OUT.txt and OUT.json of the results so far on GPU ``gpu`` (a run cut short by its time limit keeps what it
    measured); returns the table."""
    lines = [f"# {gpu}; medians of {args.runs} runs (CUDA events: queued, all of the work queued behind a spin "
             f"kernel, and from an idle device; host: perf_counter from an idle device); GB/s of the bytes each kernel "
             f"must move, from the queued time; launchers {args.launchers} (kernels.launch) side by side"]
    for name, rows in results.items():
        lines += [f"## launcher: {name}",
                  f"{'elements':>11} {'kernel':<26} {'queued us':>10} {'idle us':>10} {'GB/s':>8} {'of copy':>8}"]
        for r in rows:
            lines.append(f"{r['numel']:>11} {'device copy':<26} {1e6 * r['copy_s']:>10.1f} "
                         f"{1e6 * r['copy_idle_s']:>10.1f} {r['copy_GBps']:>8.1f} {1:>8.2f}")
            for kernel, k in r["kernels"].items():
                lines.append(f"{r['numel']:>11} {kernel:<26} {1e6 * k['s']:>10.1f} {1e6 * k['idle_s']:>10.1f} "
                             f"{k['GBps']:>8.1f} {k['of_copy']:>8.2f}")
            w = r["worker_step"]
            lines.append(f"{r['numel']:>11} worker step: fused {1e6 * w['fused_s']:.1f} us, DeepSpeed-style "
                         f"{1e6 * w['deepspeed_style_s']:.1f} us, {w['speedup']:.1f}x queued; from idle "
                         f"{1e6 * w['fused_idle_s']:.1f} / {1e6 * w['deepspeed_style_idle_s']:.1f} us, "
                         f"{w['speedup_idle']:.1f}x; compressed_allreduce (1 rank) "
                         f"{1e6 * r['compressed_allreduce_1rank_s']:.1f} us, host "
                         f"{1e6 * r['compressed_allreduce_host_s']:.1f} us ({own(r, 'compressed_allreduce')})")
            lines.append(f"{r['numel']:>11} compressed_allreduce with a scale per {BLOCK_SIZE} elements (the DDP "
                         f"hook's default; 1 rank) {1e6 * r['blocks_1rank_s']:.1f} us, host "
                         f"{1e6 * r['blocks_host_s']:.1f} us ({own(r, 'blocks')})")
            lines.append(f"{r['numel']:>11} server step: device {1e6 * r['serve']['device_s']:.1f} us, host "
                         f"{1e6 * r['serve']['host_s']:.1f} us to queue it")
            lines.append(f"{r['numel']:>11} per call (launches/wraps/waits/torch ops/allocations): " + ", ".join(
                f"{p} {c['launches']}/{c['wraps']}/{c['waits']}/{c['torch']}/{c['allocations']}"
                for p, c in r["counts"].items()))
        lines += aims(rows)
    table = "\n".join(lines)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.with_suffix(".txt").write_text(table + "\n")
    args.out.with_suffix(".json").write_text(json.dumps({"gpu": gpu, "command": " ".join(sys.argv),
                                                         "results": results}, indent=1))
    return table


if __name__ == "__main__":
    sys.exit(main())
