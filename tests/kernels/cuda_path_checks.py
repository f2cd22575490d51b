"""The CUDA path of the codecs, collectives and optimizers on CPU tensors, its kernels under numba's simulator.

Run in a process with ``NUMBA_ENABLE_CUDASIM=1`` and ``COMPCOLL_CUDA_ON_CPU=1`` (``kernels.launch.simulate``):
CPU tensors then take every CUDA branch of ``codecs`` and the algorithms, down to ``kernels.launch``,
whose kernels run in the simulator on the tensors' own memory through the pointers, shapes and strides
a GPU gets. Each part runs the suite's own rank bodies, which check every output, error buffer and
optimizer step against the numpy reference, on thread worlds (DDP's hook on torch's threaded process
group); or, for the codecs and the counts, the same calls with the CPU path in this process.
"""

from __future__ import annotations

import argparse
import importlib
import math
import sys
import time

import torch
from numba import config

from compcoll import SingleComm, codecs
from compcoll.bench.launches import PROTOCOLS, call_counts
from compcoll.kernels import cuda
from compcoll.kernels.launch import COUNTS, simulate, simulating
from compcoll.spec import STAGES, stream_key
from compcoll.launcher import run_threads
from tests.kernels import simulator

SMALL = [[1], [37], [3, 7, 11]]
ALGORITHMS = "tests.algorithms."
OPTIMIZERS = "tests.optim.optim_workers:"
WORLDS: dict[str, list[tuple[str, int, tuple]]] = {
    "flat": [(ALGORITHMS + "onebit_workers:numerics", 1, (SMALL + [[1001]], 2)),
             (ALGORITHMS + "onebit_workers:numerics", 3, (SMALL, 2)),
             (ALGORITHMS + "launch_workers:in_flight", 3, (SMALL, 2)),
             (ALGORITHMS + "agreement_workers:device_rounds", 1, ([[37]], 1, False)),
             (ALGORITHMS + "agreement_workers:device_rounds", 2, ([[37]], 1, False))],
    "blocks": [(ALGORITHMS + "onebit_workers:blockwise", 3, ([[1], [37], [1001]], 2)),
               (ALGORITHMS + "onebit_workers:levels", 3, ([[1], [37], [1001]], 2)),
               (ALGORITHMS + "reduce_scatter_workers:numerics", 3, ([1, 37, 1000], 2))],
    "replay": [(ALGORITHMS + "replay_workers:replayed_matches_reference", 2, ([37], 4)),
               (ALGORITHMS + "replay_workers:replayed_matches_reference", 4, ([37], 4, "cpu", 2)),
               (ALGORITHMS + "replay_workers:replayed_on_the_device", 2, ([37], 4)),
               (ALGORITHMS + "replay_workers:scatter_replayed_matches_reference", 2, (37, 4)),
               (ALGORITHMS + "replay_workers:birder_replayed_matches_reference", 4, (37, 5, "cpu", 2))],
    "hierarchical": [(ALGORITHMS + "hierarchical_workers:numerics", 4, (2, SMALL, 2)),
                     (ALGORITHMS + "hierarchical_workers:compensated_blocks", 4, (2, [[37], [1001]], 2)),
                     (ALGORITHMS + "hierarchical_workers:compensated_allgather", 4, (2, [[37], [1001]], 2)),
                     (ALGORITHMS + "replay_workers:replayed_on_the_device", 4, ([37], 4, "cpu", 2))],
    "optimizers": [(OPTIMIZERS + "onebit_adam_reference", 2, (3, 6)),
                   (OPTIMIZERS + "onebit_lamb_reference", 2, (6,)),
                   (OPTIMIZERS + "zero_one_adam_reference", 2, (8,)),
                   (OPTIMIZERS + "birder_reference", 2, (4,))],
}
"""Thread-world parts: (rank body, ranks, its arguments); each body checks itself against the reference."""
TORCH_GROUPS: dict[str, list[tuple[str, int, tuple]]] = {
    "ddp": [("tests.ddp.ddp_workers:onebit_matches_reference", 2, (3, "gather_scatter", "l2", "auto", 1, None, "cpu",
                                                                   True))],
}
"""Parts on torch's multi-threaded process group (DDP's buckets through the hook), as ``WORLDS``; DDP's small model
(a compressed bucket of 2,298 elements and a plain one: the hook's path, where the 423,107 parameters of the CPU
tests' model took 55 s of the simulator for 10 launches)."""
PARTS = (*WORLDS, *TORCH_GROUPS, "codecs", "counts")


def _finite_probes(x: torch.Tensor) -> list[torch.Tensor]:
    """Tensors for ``codecs.all_finite``: ``x``; with a NaN, an Inf, both infinities; float32's largest many
    times (finite; its float64 sum too, not float32's); float64's largest twice (finite; its sum is not)."""
    probes = [x]
    for values in ([math.nan], [math.inf], [math.inf, -math.inf]):
        probe = x.clone()
        probe[:len(values)] = torch.tensor(values[:x.numel()]).to(x.dtype)
        probes.append(probe)
    largest = torch.finfo(torch.float32).max
    return probes + [torch.full((x.numel(),), largest).to(x.dtype),
                     torch.full((2,), torch.finfo(torch.float64).max, dtype=torch.float64)]


def _fold_finite(probe: torch.Tensor, full: int, fold: str) -> bool:
    """The finite test a fold writes beside its statistics (``codecs.block_sums`` / ``block_absmax`` / ``row_absmax``
    with ``finite``) of ``probe`` padded to ``full``: 8 elements a block, or 3 rows."""
    flag = torch.full((1,), 7.0, dtype=torch.float64)
    if fold == "sums":
        codecs.block_sums(probe, torch.zeros(full), 8, finite=flag)
    elif fold == "absmax":
        codecs.block_absmax(probe, torch.zeros(full), 8, 1, finite=flag)
    else:
        codecs.row_absmax(probe, 3, full, finite=flag)
    return math.isfinite(codecs.host_value(flag))


def check_codecs(numel: int, dtype: torch.dtype) -> None:
    """Every 1-bit codec on the CUDA path gives the CPU path's bits (``tests/gpu``'s codec check, without a GPU)."""
    gen = torch.Generator().manual_seed(numel)
    x = (torch.randn(numel, generator=gen) * 3).to(dtype)
    full = -(-numel // 24) * 24
    err = torch.randn(full, generator=gen) * 0.1
    results = []
    for on in (False, True):
        simulate(on)
        e = err.clone()
        total = codecs.compensated_sum(x, e)
        absolute = torch.empty(1, dtype=torch.float64)
        codecs.compensated_sum(x, e, "l1", out=absolute)
        absolute = codecs.host_value(absolute)
        bits = torch.empty(full // 8, dtype=torch.uint8)
        codecs.compensate_encode(x, e, 0.5, bits)
        rows = bits.view(3, -1)
        acc = torch.empty(full // 3)
        squares = codecs.accumulate_signs(rows, torch.tensor([0.3, 0.2, 0.1]), None, acc, full // 3)
        scale = codecs.accumulate_scale(rows, torch.tensor([0.3, 0.2, 0.1]), acc, acc, full // 3, full // 3)
        out = torch.empty(numel, dtype=dtype)
        codecs.decode(rows, torch.tensor([1.5, 2.5, 3.5]), out)
        maxima = codecs.row_absmax(x, 3, full)
        wire = torch.zeros(3, codecs.SCALE_BYTES + full // 24, dtype=torch.uint8)
        codecs.randomized_encode(x, maxima, stream_key(7, 2, STAGES["node"], 1), 0, wire)
        decoded = torch.empty(full)
        codecs.decode_framed(wire, decoded)
        decoded_as = torch.empty(full, dtype=dtype)  # a 16-bit output's scales rounded first
        codecs.decode_framed(wire, decoded_as)
        weights = torch.cat([codecs.unframe(wire, 3)[0], codecs.unframe(wire[:1], 7)[0], codecs.unframe(wire)[0]])
        head = torch.zeros(codecs.SCALE_BYTES + full // 24, dtype=torch.uint8)
        headed = codecs.accumulate_scale(rows, torch.tensor([0.3, 0.2, 0.1]), None, torch.empty(full // 3),
                                         full // 3, full // 3, head=head)
        strided = torch.stack([x, -x], dim=1)[:, 0]  # x again, every other element of its storage
        strided_bits = torch.empty(full // 8, dtype=torch.uint8)
        codecs.compensate_encode(strided, err.clone(), 0.5, strided_bits)
        finite = torch.tensor([codecs.all_finite(probe) for probe in _finite_probes(x)] + [
            codecs.all_finite(codecs.block_sums(probe, torch.zeros(full), 8))
            for probe in _finite_probes(x)[:-1]] + [  # block sums of |x|^2, float32's largest ones too
            _fold_finite(probe, full, fold) for fold in ("sums", "absmax", "rows") for probe in _finite_probes(x)[:-1]])
        norms = torch.empty(4, dtype=torch.float64)
        codecs.segment_sumsq(err, (0, 0, 5, full // 2, full), norms)
        results.append((total, absolute, squares, float(scale), bits, e, acc, out, maxima, wire, decoded,
                        decoded_as, weights, float(headed), head, finite, codecs.compensated_sum(strided, err),
                        strided_bits, norms))
    simulate(True)
    names = ("sumsq", "sum |x|", "accumulate sumsq", "accumulate scale", "bits", "error", "accumulate", "decode",
             "absmax", "wire", "decoded wire", f"decoded wire as {dtype}", "weights from the frames",
             "scale into a frame head", "frame head", "finite checks", "sumsq of a strided source",
             "bits of a strided source", "sums of squares by segment")
    for name, a, b in zip(names, *results):
        same = a == b if isinstance(a, float) else torch.equal(a.view(torch.uint8), b.view(torch.uint8))
        assert same, f"{name} of {numel} {dtype}: the CUDA path differs from the CPU's"


def check_counts(numel: int, protocols: tuple[str, ...] = PROTOCOLS) -> None:
    """One call of each of ``protocols`` launches, wraps and waits on CPU tensors as on meta tensors
    (``scripts/cuda_launches.py``'s counts are those of a path that runs)."""
    x = torch.randn(numel, generator=torch.Generator().manual_seed(numel))
    ran = call_counts(x, SingleComm(), protocols=protocols)
    traced = call_counts(torch.empty(numel, device="meta"), SingleComm(), protocols=protocols)
    assert all(c["launches"] > 0 for c in ran.values()), ran
    for counts in (ran, traced):  # numba's dispatcher (the simulator's) wraps; meta counts the same wraps
        for c in counts.values():  # torch's operators and allocations on CPU tensors are not a device's
            c.pop("torch")
            c.pop("allocations")
    assert ran == traced, f"{numel} elements: ran {ran}, traced {traced}"


def _on_torch_group(target: str, ranks: int, args: tuple, timeout: float) -> None:
    """``target`` ("module:function") on ``ranks`` threads of torch's multi-threaded process group."""
    from tests.ddp.threaded_group import run_threaded_group

    module, name = target.split(":")
    run_threaded_group(getattr(importlib.import_module(module), name), ranks, *args, timeout=timeout)


def run_part(part: str) -> list[str]:
    """One part of ``PARTS``; returns a line per check with its time and launches."""
    lines = []
    worlds = [(run_threads, case) for case in WORLDS.get(part, [])]
    for runner, (target, ranks, args) in worlds + [(_on_torch_group, case) for case in TORCH_GROUPS.get(part, [])]:
        COUNTS.reset()
        start = time.perf_counter()
        runner(target, ranks, args=args, timeout=1200)
        assert COUNTS.launches > 0, f"{target} launched no CUDA kernel: the CPU path ran"
        lines.append(f"{target} x{ranks}: {time.perf_counter() - start:.1f} s, {COUNTS.launches} launches")
    if part == "codecs":
        for numel in (1, 37, 1000):
            for dtype in (torch.float32, torch.float16, torch.bfloat16):
                check_codecs(numel, dtype)
        lines.append("codecs: 1, 37, 1000 elements, three dtypes")
    if part == "counts":
        kept = cuda.sums.TAIL
        flat = tuple(p for p in PROTOCOLS if not p.endswith(("_blocks", "_levels")))  # block scales and steps: the
        check_counts(37)  # same counts at any length, and seconds a launch of their coder (CODE_THREADS threads)
        check_counts(4096, flat)
        cuda.sums.TAIL = 32  # past TAIL lane sums, each sum's last blocks add them in groups (sums._finish_lanes)
        try:
            check_counts(8200, flat)
        finally:
            cuda.sums.TAIL = kept
        lines.append("counts: 37 elements, 4096 and 8200 past the tail (without block scales or levels)")
    return lines


def main(argv: list[str]) -> int:
    """Run the ``--part`` parts (all by default)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--part", action="append", choices=PARTS, help="one part (repeatable); default: all")
    args = parser.parse_args(argv)
    assert config.ENABLE_CUDASIM and simulating(), "set NUMBA_ENABLE_CUDASIM=1 and COMPCOLL_CUDA_ON_CPU=1"
    simulator.install(check=False)  # the kernels' races: cuda_sim_checks, on the GPU's thread counts
    cuda.sums.COLLAPSE_THREADS = 128  # a kept Python thread per CUDA thread of a block: 1024 would make 1024
    cuda.scales.CODE_THREADS = 32  # threads, and 256 a block-scale coder's launch (seconds each)
    cuda.sums.LANE_THREADS = cuda.blocks.FOLD_THREADS = 32  # and their barriers, 2 a summation block or a block
    # kernel's round; two rounds a block of 64, a warp's load staging one block's 32 (cuda_sim_checks: the GPU's 8)
    cuda.blocks.STAGE, cuda.blocks._STAGED = 32, (cuda.common.THREADS, 33)
    parts = args.part or list(PARTS)
    for part in parts:
        for line in run_part(part):
            print(line, flush=True)
    print(f"the CUDA path == the reference and the CPU path: {', '.join(parts)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
