"""compcoll's compressed_allreduce beside DeepSpeed 0.19.6's own, on Gloo ranks and CPU tensors: time and numerics.

Usage (needs ``pip install -e '.[deepspeed]'``; from the repository root):
    .venv/bin/python bench/peers/allreduce.py --out bench/results/deepspeed_allreduce

1. Start ``--ranks`` Gloo ranks (``compcoll.launcher``, one torch / Numba thread each on
   this 2-core machine at 2 ranks). Each rank draws its own random input of ``--numel``
   float32 elements.
2. Interleaved, ``--runs`` times after one warmup each: DeepSpeed's
   ``CompressedBackend.compressed_allreduce`` (with the shims of ``deepspeed_shim.py``)
   and ``compcoll.compressed_allreduce`` (l2 scale, DeepSpeed's) on the same Gloo group,
   each with its own error buffers; a barrier before every call, rank 0's wall time.
3. Numerics on a fresh input with zeroed buffers: the largest difference between the two
   results, relative to the largest magnitude, and whether every rank holds the same bits.
4. Rank 0 writes OUT.json and OUT.txt: medians, the ratio, the numerics.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402

import compcoll  # noqa: E402
from compcoll.launcher import run  # noqa: E402


def job(comm: compcoll.Communicator, config_json: str) -> None:
    """One rank: time both allreduces side by side, compare their results (steps 1-4)."""
    import torch.distributed as dist

    import deepspeed_shim

    config = json.loads(config_json)
    deepspeed_shim.load()
    from deepspeed.runtime.comm.compressed import CompressedBackend

    backend = CompressedBackend()
    n, size = config["numel"], comm.size
    x = torch.randn(n, generator=torch.Generator().manual_seed(comm.rank))
    ds_chunk = math.lcm(size, 8) * size  # DeepSpeed pads to a multiple of size * lcm(size, 8)
    ds_full = -(-n // ds_chunk) * ds_chunk
    ds_errors = torch.zeros(ds_full), torch.zeros(ds_full // size)
    full = compcoll.padded_numel(n, size)
    errors = torch.zeros(full), torch.zeros(full // size)
    out, ds_in = torch.empty_like(x), torch.empty_like(x)
    cases = {  # DeepSpeed's call adds its error into its input: a fresh copy, made before the clock starts
        "deepspeed": lambda: backend.compressed_allreduce(ds_in, *ds_errors, 0),
        "compcoll": lambda: compcoll.compressed_allreduce(x, *errors, comm, out=out),
    }
    times: dict[str, list[float]] = {name: [] for name in cases}
    for fn in cases.values():
        ds_in.copy_(x)
        fn()
    for _ in range(config["runs"]):
        for name, fn in cases.items():
            ds_in.copy_(x)
            dist.barrier()
            start = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - start)
    for buffer in (*ds_errors, *errors):
        buffer.zero_()
    fresh = torch.randn(n, generator=torch.Generator().manual_seed(1000 + comm.rank))
    theirs = backend.compressed_allreduce(fresh.clone(), *ds_errors, 0)
    ours = compcoll.compressed_allreduce(fresh, *errors, comm)
    both = torch.stack([theirs, ours])
    every = [torch.empty_like(both) for _ in range(size)]
    dist.all_gather(every, both)
    if comm.rank == 0:
        medians = {name: statistics.median(t) * 1e3 for name, t in times.items()}
        result = {
            "numel": n, "ranks": size, "runs": config["runs"], "threads": torch.get_num_threads(),
            "median_ms": medians, "all_ms": {name: [s * 1e3 for s in t] for name, t in times.items()},
            "speedup": medians["deepspeed"] / medians["compcoll"],
            "max_rel_difference": ((theirs - ours).abs().max() / theirs.abs().max()).item(),
            "sign_agreement": (torch.sign(theirs) == torch.sign(ours)).float().mean().item(),
            "identical_on_all_ranks": {
                "deepspeed": all(torch.equal(e[0], every[0][0]) for e in every),
                "compcoll": all(torch.equal(e[1], every[0][1]) for e in every),
            },
        }
        Path(config["out"]).write_text(json.dumps(result, indent=1))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--numel", type=int, default=16 * 2**20)
    p.add_argument("--runs", type=int, default=9)
    p.add_argument("--out", type=Path, required=True, help="write OUT.json and OUT.txt")
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "result.json"
        config = dict(numel=args.numel, runs=args.runs, out=str(out))
        run("allreduce:job", args.ranks, "gloo", args=(json.dumps(config),), timeout=1800)
        result = json.loads(out.read_text())
    result["command"] = " ".join(sys.argv)
    ms = result["median_ms"]
    table = "\n".join([
        f"# compressed_allreduce, {result['ranks']} Gloo ranks x {result['threads']} thread(s), {result['numel']} "
        f"float32, CPU; rank 0's wall time, median of {result['runs']} interleaved runs",
        f"deepspeed 0.19.6 CompressedBackend  {ms['deepspeed']:9.1f} ms",
        f"compcoll.compressed_allreduce       {ms['compcoll']:9.1f} ms",
        f"speedup                             {result['speedup']:9.1f}x",
        f"# numerics on a fresh input: max |theirs - ours| / max |theirs| = {result['max_rel_difference']:.2e}, "
        f"same sign on {100 * result['sign_agreement']:.4f}% of elements; identical on all ranks: "
        f"{result['identical_on_all_ranks']}",
    ])
    print(table)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.with_suffix(".txt").write_text(table + "\n")
    args.out.with_suffix(".json").write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
