"""Issue 39, item 4: compressed_allreduce with its device part replayed from a CUDA graph, against eager calls.

Usage (on a machine with an NVIDIA GPU, torch with CUDA and numba-cuda):
    python bench/gpu_graphs.py --out bench/results/gpu_graphs

A call is its plan's ``agree_flat`` / ``agree_blocks`` (the worker's sum or block sums, the one host wait, the
agreement, and for one scale over a host round the weights and the worker's scale copied to the device; over
NCCL's round the encode derives them from the round's sums) then ``finish_flat`` /
``finish_blocks`` (kernels and the wire into workspace buffers, reading no host value: no wait, no allocation once
warm). ``graphed_step`` runs the first eagerly and replays a CUDA graph of the second, captured once on a stream of
its own. Both forms: one scale (``flat``, the default call) and a scale per ``ddp.onebit.BLOCK_SIZE`` elements
(``blocks``, the DDP hook's default). On one rank, over each of ``--comms`` (``single``: ``SingleComm``, whose wire
is device copies; ``nccl``: a one-rank NCCL group through ``compcoll.init``, whose collectives the graph must capture
too; ``nccl-host``: that group with its agreement rounds on host numbers, as NCCL's were until 2026-12-01;
``nccl-async``: with its blocking collectives issued asynchronously on NCCL's stream, as until 2026-12-06),
at each size:
1. The bits: from zeroed error buffers, ``--steps`` calls on fresh random inputs each way, eager and graphed; the
   results and both error buffers must be equal, bit for bit.
2. The host microseconds per call in a loop of ``--calls`` (median of ``--runs``; ``compcoll.bench.launches``):
   eager, and graphed (agreement eagerly, then the replay).
3. The device microseconds of the device part alone, queued (``compcoll.bench.clocks.QueuedClock``, median of
   ``--runs``): the floor a call's time could come down to once its host time is below it.
A row that fails (a capture the transport refuses) records its error and the run goes on; OUT.txt and OUT.json are
written after every row, so a run cut short keeps what it measured.
What this leaves to the feature (not built: only where it measures faster): a graph per bucket keyed on its data
pointers, capture agreed by every rank at the same call, the transport's own graph support (NCCL's), a timeout for
a replay, and the bytes counters (a replay counts nothing). Writes OUT.txt and OUT.json with the GPU's name.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Callable

import torch

import compcoll
from compcoll.algorithms.onebit import FlatPlan
from compcoll.bench.clocks import QueuedClock, timed
from compcoll.bench.launches import per_call_us
from compcoll.bench.one_rank import one_rank_comm
from compcoll.comm import Communicator
from compcoll.ddp.onebit import BLOCK_SIZE

FORMS = {"flat": None, "blocks": BLOCK_SIZE}
"""The forms measured: one scale per vector and chunk (``compressed_allreduce``'s default), and the DDP hook's."""


def call_parts(x: torch.Tensor, worker_error: torch.Tensor, comm: Communicator, block_size: int | None
               ) -> tuple[Callable[[], object], Callable[..., torch.Tensor]]:
    """A plan of its own (in one piece) for ``x``'s calls, as (agree, finish): ``agree()`` runs the agreement part
    and returns what ``finish(x, worker_error, server_error, agreed, out)`` takes."""
    plan = FlatPlan(comm, x.numel(), x.device, "gather_scatter", 1, "l2", block_size, 1)
    if block_size is None:
        return (lambda: plan.agree_flat(x, worker_error)[1]), plan.finish_flat
    return (lambda: plan.agree_blocks(x, worker_error)), plan.finish_blocks


def device_part_us(x: torch.Tensor, worker_error: torch.Tensor, server_error: torch.Tensor, out: torch.Tensor,
                   comm: Communicator, block_size: int | None, runs: int) -> float | None:
    """Device microseconds of the device part (``finish``) after one agreement, queued (median of ``runs``); None
    where it waits for the device, which the queued clock refuses."""
    agree, finish = call_parts(x, worker_error, comm, block_size)
    agreed = agree()
    try:
        return 1e6 * timed(lambda: finish(x, worker_error, server_error, agreed, out), runs, clock=QueuedClock())
    except RuntimeError:
        return None


def graphed_step(x: torch.Tensor, worker_error: torch.Tensor, server_error: torch.Tensor, out: torch.Tensor,
                 comm: Communicator, block_size: int | None, warmup: int = 2) -> Callable[[], torch.Tensor]:
    """A function that does what ``compressed_allreduce(x, worker_error, server_error, comm, out=out,
    block_size=block_size)`` does, its device part replayed from a CUDA graph; its first call captures.

    1. A plan of its own (in one piece), whose workspace, like the kernels' temporaries, is kept per stream: every
       step runs on one side stream, so what the agreement leaves on the device lands in the buffers the graph
       reads.
    2. Warm-up on that stream (``warmup`` whole calls, whose results are dropped and whose error buffers are put
       back): kernels compiled, workspace and temporaries allocated, so the capture allocates nothing.
    3. Each call: the current stream's work before it is waited for on the side stream; the agreement eagerly;
       then the captured device part is replayed (captured at the first call); the current stream waits for the
       side stream's work.
    """
    agree, finish = call_parts(x, worker_error, comm, block_size)
    side = torch.cuda.Stream(x.device)
    graph: list[torch.cuda.CUDAGraph] = []

    def step() -> torch.Tensor:
        side.wait_stream(torch.cuda.current_stream(x.device))
        with torch.cuda.stream(side):
            agreed = agree()
            if not graph:
                kept = worker_error.clone(), server_error.clone()
                for _ in range(warmup):
                    finish(x, worker_error, server_error, agreed, out)
                    worker_error.copy_(kept[0])
                    server_error.copy_(kept[1])
                    agreed = agree()
                side.synchronize()
                graph.append(torch.cuda.CUDAGraph())
                with torch.cuda.graph(graph[0], stream=side):
                    finish(x, worker_error, server_error, agreed, out)
            graph[0].replay()
        torch.cuda.current_stream(x.device).wait_stream(side)
        return out

    return step


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return torch.equal(a.view(torch.uint8), b.view(torch.uint8))


def measure(numel: int, steps: int, calls: int, runs: int, comm: Communicator | None = None,
            block_size: int | None = BLOCK_SIZE) -> dict:
    """Bits and host time per call at ``numel`` float32 elements on one rank (steps 1-2 of the module), over ``comm``
    (default a ``SingleComm``), with one scale per ``block_size`` elements (None: one scale)."""
    dev = torch.device("cuda", torch.cuda.current_device())
    gen = torch.Generator(device=dev).manual_seed(numel)
    comm = compcoll.SingleComm() if comm is None else comm
    full = compcoll.padded_numel(numel, comm.size)
    x = torch.randn(numel, device=dev, generator=gen)
    eager_buffers = [torch.zeros(full, device=dev), torch.zeros(full, device=dev), torch.empty(numel, device=dev)]
    graph_buffers = [torch.zeros(full, device=dev), torch.zeros(full, device=dev), torch.empty(numel, device=dev)]
    we, se, out = eager_buffers

    def eager() -> torch.Tensor:
        return compcoll.compressed_allreduce(x, we, se, comm, out=out, block_size=block_size)

    graphed = graphed_step(x, *graph_buffers, comm, block_size)
    equal = True
    for _ in range(steps):
        x.copy_(torch.randn(numel, device=dev, generator=gen))
        eager()
        graphed()
        torch.cuda.synchronize()
        equal = equal and all(same_bits(a, b) for a, b in zip(eager_buffers, graph_buffers))
    return {"numel": numel, "same_bits": equal,
            "eager_us": per_call_us(eager, calls, runs, torch.cuda.synchronize),
            "graphed_us": per_call_us(graphed, calls, runs, torch.cuda.synchronize),
            "device_part_us": device_part_us(x, *eager_buffers, comm, block_size, runs)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="4096,1048576,16777216,67108864")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--comms", default="single,nccl,nccl-async,nccl-host")
    parser.add_argument("--forms", default="flat,blocks")
    parser.add_argument("--out", default="bench/results/gpu_graphs")
    args = parser.parse_args()
    rows: list[dict] = []
    comms: dict[str, Communicator] = {}
    for form in args.forms.split(","):
        for n in args.sizes.split(","):
            for kind in args.comms.split(","):
                row = {"comm": kind, "form": form, "numel": int(n)}
                try:
                    if kind not in comms:
                        comms[kind] = one_rank_comm(kind)
                    row.update(measure(int(n), args.steps, args.calls, args.runs, comms[kind], FORMS[form]))
                except Exception as exc:  # a refused capture (or transport) is a result of this experiment
                    row["error"] = f"{type(exc).__name__}: {exc}".splitlines()[0]
                rows.append(row)
                print(write(rows, args), flush=True)


def write(rows: list[dict], args: argparse.Namespace) -> str:
    """OUT.txt and OUT.json of the rows so far (a run cut short by its time limit keeps what it measured); returns
    the last row's line."""
    name = torch.cuda.get_device_name()
    lines = [f"# bench/gpu_graphs.py on {name}: compressed_allreduce on one rank, one scale (flat) or one per "
             f"{BLOCK_SIZE} elements (blocks); host us per call in a loop of {args.calls}, median of {args.runs}",
             f"{'comm':>9} {'form':>6} {'elements':>11} {'eager us':>9} {'graphed us':>10} {'ratio':>6} "
             f"{'device part us':>14} same bits"]
    for r in rows:
        head = f"{r['comm']:>9} {r['form']:>6} {r['numel']:>11}"
        if "error" in r:
            lines.append(f"{head} failed: {r['error']}")
            continue
        device = "waits" if r["device_part_us"] is None else f"{r['device_part_us']:.1f}"
        lines.append(f"{head} {r['eager_us']:>9.1f} {r['graphed_us']:>10.1f} {r['eager_us'] / r['graphed_us']:>5.2f}x "
                     f"{device:>14} {r['same_bits']}")
    Path(args.out + ".txt").write_text("\n".join(lines) + "\n")
    Path(args.out + ".json").write_text(json.dumps({"gpu": name, "rows": rows}, indent=1) + "\n")
    return lines[-1]


if __name__ == "__main__":
    main()
