"""Where a CUDA call's host time goes: each step of one kernel launch timed alone, and a profile of whole calls.

Usage (on a machine with an NVIDIA GPU, torch with CUDA and numba-cuda):
    python bench/gpu_host_profile.py --out bench/results/gpu_host_profile

1. Each step that ``codecs`` and ``kernels.launch`` take to launch one kernel, timed alone
   on the host (median over ``--rounds`` rounds of ``--loops`` calls, microseconds per call):
   torch's current stream, numba's stream and context, the launcher's variant lookup and
   argument flattening, a tensor view, a torch allocation, ``cuda.core.launch`` itself, the
   whole ``launch`` and a whole one-kernel codec call; beside them one torch kernel
   (``add_``) for scale.
2. The host time of one ``compressed_allreduce`` call on one rank at ``--numel`` elements,
   and its profile (``cProfile`` over ``--calls`` calls): the functions with the most time of
   their own and the most time in all.
3. The same call's timeline under ``torch.profiler`` (CUPTI sees every kernel, numba's and
   ``cuda.core``'s too): per call, the device activities' time, and the device's idle time
   between the call's first activity's start and its last one's end; the operators and
   kernels by host and by device time. Then, by device time alone, the DDP hook's default
   form (a scale per ``ddp.onebit.BLOCK_SIZE`` elements) at ``--numel``, and both forms at
   ``--large`` elements.
4. Steps 2 and 3 at ``--numel`` (its first table) again over each further one-rank communicator of ``--comms``
   (``compcoll.bench.one_rank``: ``SingleComm`` with its rounds on host numbers, as until 2026-12-06, and a
   one-rank NCCL group, its rounds on the device or on host numbers, or its blocking collectives issued
   asynchronously on NCCL's own stream, as until 2026-12-06), to place
   what NCCL adds to a call's host time (gpu_graphs' eager NCCL call: 425-573 us at 4K-1M elements on the H200
   where ``SingleComm``'s took 214-227).
5. The host time of one call of every protocol (``compcoll.bench.launches.protocol_calls``) at ``--numel`` over
   each communicator of ``--comms``, side by side (``forms_table``): NCCL's rounds on the device against on host
   numbers for every form (the compensated hierarchical forms' first round on the device since 2026-12-05), and
   in stream order against asynchronous.
Writes OUT.txt with the GPU's name, and OUT.trace.json (the profiler's trace, for chrome://tracing).
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
from pathlib import Path
from typing import Callable

import torch

import compcoll
from compcoll import codecs
from compcoll.bench.launches import per_call_us, protocol_calls
from compcoll.bench.one_rank import one_rank_comm
from compcoll.comm import Communicator
from compcoll.ddp.onebit import BLOCK_SIZE
from compcoll.kernels.cuda import records
from compcoll.kernels import bound
from compcoll.kernels import launch as launching
from compcoll.kernels.arrays import DeviceArray


def steps(loops: int, rounds: int) -> list[tuple[str, float]]:
    """Host microseconds of each step of a one-kernel codec call (``scale_from`` on a device sum)."""
    from numba import cuda

    dev = torch.device("cuda", torch.cuda.current_device())
    total = torch.ones(1, dtype=torch.float64, device=dev)
    out = torch.empty(1, dtype=torch.float32, device=dev)
    handle = torch.cuda.current_stream(dev).cuda_stream
    stream = codecs.dispatch.numba_stream(dev.index, handle)
    args = (DeviceArray.of(total), 4096, 64.0, True, DeviceArray.of(out))
    kernel = records._scale_of
    core_kernel, flatteners = bound.bound_kernel(kernel, launching._device_id(), tuple(map(bound.variant_key, args)))
    flat: list = []
    for flatten, arg in zip(flatteners, args):
        flatten(arg, flat)
    core_stream = bound.core_stream(stream)
    config = bound.launch_config(1, 1)
    keys = tuple(map(bound.variant_key, args))
    small = torch.zeros(16, device=dev)

    def flatten_all() -> None:
        into: list = []
        for flatten, arg in zip(flatteners, args):
            flatten(arg, into)

    def context() -> None:
        with cuda.gpus[dev.index]:
            pass

    cases = {
        "torch.cuda.current_stream(dev).cuda_stream": lambda: torch.cuda.current_stream(dev).cuda_stream,
        "codecs.dispatch.numba_stream (cached)": lambda: codecs.dispatch.numba_stream(dev.index, handle),
        "with cuda.gpus[i] (numba context)": context,
        "launch._device_id()": launching._device_id,
        "launch.launcher()": launching.launcher,
        "DeviceArray.of(tensor)": lambda: DeviceArray.of(total),
        "codecs.dispatch.view(tensor) (detach + view)": lambda: codecs.dispatch.view(total),
        "torch.empty(1, device)": lambda: torch.empty(1, dtype=torch.float32, device=dev),
        "argument keys (5 args)": lambda: tuple(map(bound.variant_key, args)),
        "bound.bound_kernel lookup (cached)": lambda: bound.bound_kernel(kernel, 0, keys),
        "flatten 5 args": flatten_all,
        "cuda.core launch, flat args ready": lambda: bound.core_launch(core_stream, config, core_kernel, *flat),
        "kernels.launch.launch (whole)": lambda: launching.launch(kernel, 1, 1, stream, *args),
        "codecs.scale_from (whole codec call)": lambda: codecs.scale_from(total, 4096, "l2"),
        "torch add_ on 16 elements (for scale)": lambda: small.add_(1.0),
    }
    return [(name, per_call_us(fn, loops, rounds, torch.cuda.synchronize)) for name, fn in cases.items()]


def profile_call(numel: int, calls: int, comm: Communicator) -> tuple[float, str, dict]:
    """One rank's compressed_allreduce at ``numel`` over ``comm``: host microseconds per call, its profile, its
    counts."""
    dev = torch.device("cuda", torch.cuda.current_device())
    gen = torch.Generator(device=dev).manual_seed(numel)
    x = torch.randn(numel, device=dev, generator=gen)
    full = compcoll.padded_numel(numel, 1)
    we, se = torch.zeros(full, device=dev), torch.zeros(full, device=dev)
    out = torch.empty(numel, device=dev)

    def call() -> None:
        compcoll.compressed_allreduce(x, we, se, comm, out=out)

    host = per_call_us(call, 20, 7, torch.cuda.synchronize)
    launching.COUNTS.reset()
    call()
    torch.cuda.synchronize()
    counts = {"launches": launching.COUNTS.launches, "wraps": launching.COUNTS.wraps, "waits": launching.COUNTS.waits}
    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(calls):
        call()
    profiler.disable()
    torch.cuda.synchronize()
    text = io.StringIO()
    stats = pstats.Stats(profiler, stream=text)
    stats.sort_stats("tottime").print_stats(45)
    stats.sort_stats("cumulative").print_stats(60)
    return host, text.getvalue(), counts


def forms_table(numel: int, comms: dict[str, Communicator], device: torch.device,
                synchronize: Callable[[], None], calls: int = 20, runs: int = 7) -> list[str]:
    """Step 5: a row per protocol, the host microseconds of one call (median of ``runs`` loops of ``calls``) over
    each of ``comms`` (by name), on ``numel`` float32 elements on ``device``; a call that fails gets "failed" and
    its error a line below the table."""
    x = torch.randn(numel, device=device, generator=torch.Generator(device=device).manual_seed(numel))
    cells: dict[str, list[str]] = {}
    errors = []
    for kind, comm in comms.items():
        for name, call in protocol_calls(x, comm).items():
            try:
                cells.setdefault(name, []).append(f"{per_call_us(call, calls, runs, synchronize):12.1f}")
            except Exception as exc:  # a bench row, not a test: say what failed and go on
                cells.setdefault(name, []).append(f"{'failed':>12s}")
                errors.append(f"# {name} over {kind}: {type(exc).__name__}: {str(exc).splitlines()[0]}")
    return [f"# host us a call at {numel} elements, one rank, median of {runs} loops of {calls}",
            f"{'protocol':24s}" + "".join(f"{kind:>12s}" for kind in comms),
            *(f"{name:24s}" + "".join(row) for name, row in cells.items()), *errors]


def timeline(numel: int, calls: int, comm: Communicator, block_size: int | None = None, trace: Path | None = None,
             host_table: bool = False) -> str:
    """``calls`` calls of one rank's compressed_allreduce at ``numel`` (a scale per ``block_size`` elements, or one)
    over ``comm`` under ``torch.profiler``: a summary and tables.

    1. Warm the call up, then profile ``calls`` calls in a row (CPU and CUDA activities).
    2. From the device activities' intervals (kernels, copies): their total time per call, and
       the span from the first one's start to the last one's end per call less that total
       (the device idle, waiting for the host's launches).
    3. The activities by device time; with ``host_table``, the operators and API calls by their
       own host time first.
    """
    from torch.profiler import ProfilerActivity, profile

    dev = torch.device("cuda", torch.cuda.current_device())
    x = torch.randn(numel, device=dev, generator=torch.Generator(device=dev).manual_seed(numel))
    full = compcoll.padded_numel(numel, 1)
    we, se, out = torch.zeros(full, device=dev), torch.zeros(full, device=dev), torch.empty(numel, device=dev)

    def call() -> None:
        compcoll.compressed_allreduce(x, we, se, comm, out=out, block_size=block_size)

    for _ in range(5):
        call()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            call()
        torch.cuda.synchronize()
    if trace is not None:
        prof.export_chrome_trace(str(trace))
    kernels = sorted((e.time_range.start, e.time_range.end) for e in prof.events()
                     if e.device_type == torch.autograd.DeviceType.CUDA)
    busy = sum(end - start for start, end in kernels)
    span = kernels[-1][1] - kernels[0][0] if kernels else 0.0
    averages = prof.key_averages()
    form = f"a scale per {block_size}" if block_size else "one scale"
    tables = [averages.table(sort_by="self_cpu_time_total", row_limit=30, max_name_column_width=60)] * host_table
    return "\n".join([
        f"# {calls} calls at {numel} elements, {form}, over {comm.describe()}: {len(kernels) / calls:.1f} device "
        f"activities a call, their device time {busy / calls:.1f} us a call, the device span {span / calls:.1f} us a "
        f"call (idle "
        f"{(span - busy) / calls:.1f})", *tables,
        averages.table(sort_by="self_device_time_total", row_limit=15, max_name_column_width=60)])


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--loops", type=int, default=500)
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--numel", type=int, default=4096)
    p.add_argument("--calls", type=int, default=200)
    p.add_argument("--large", type=int, default=1 << 24, help="the profiled calls' large size (elements)")
    p.add_argument("--comms", default="single,single-host,nccl,nccl-host,nccl-async",
                   help="one-rank communicators to profile a call over, the first fully (compcoll.bench.one_rank)")
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args()
    lines = [f"# {torch.cuda.get_device_name()}; host microseconds per call, median of {args.rounds} rounds of "
             f"{args.loops}; launcher {launching.launcher()}"]
    for name, us in steps(args.loops, args.rounds):
        lines.append(f"{name:45s} {us:9.2f}")
    comms = {kind: one_rank_comm(kind) for kind in args.comms.split(",")}
    for index, (kind, comm) in enumerate(comms.items()):
        host, text, counts = profile_call(args.numel, args.calls, comm)
        lines.append(f"compressed_allreduce, 1 rank ({kind}), {args.numel} elements: {host:.1f} us of host time per "
                     f"call; {counts}")
        lines.append(f"# cProfile over {args.calls} calls ({kind})")
        lines.append(text)
        lines.append(f"# torch.profiler ({kind})")
        trace = args.out.with_suffix(".trace.json") if index == 0 else None
        lines.append(timeline(args.numel, 20, comm, trace=trace, host_table=True))
        if index == 0:
            lines.append(timeline(args.numel, 20, comm, BLOCK_SIZE))
            for block_size in (None, BLOCK_SIZE):
                lines.append(timeline(args.large, 5, comm, block_size))
        args.out.with_suffix(".txt").write_text("\n".join(lines) + "\n")
    lines += forms_table(args.numel, comms, torch.device("cuda", torch.cuda.current_device()), torch.cuda.synchronize)
    args.out.with_suffix(".txt").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
