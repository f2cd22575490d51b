"""The GPU run's benchmarks (bench/gpu_suite.py, gpu_graphs.py, gpu_host_profile.py) checked without a GPU.

They import without one, their calls of the codecs and plans run on CPU tensors (so a broken import or a changed
signature shows here, not on a lent GPU machine), and the suite refuses to run without one.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

import compcoll
from tests.bench import ROOT, bench_script


@pytest.mark.parametrize("name", ["gpu_suite", "gpu_graphs", "gpu_host_profile"])
def test_the_gpu_benchmarks_import_without_a_gpu(name: str) -> None:
    assert callable(bench_script(f"{name}.py").main)


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is here: the suite would run")
def test_the_gpu_suite_says_it_needs_a_gpu(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, str(ROOT / "bench" / "gpu_suite.py"), "--out", str(tmp_path / "k")],
                          capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert done.returncode == 2 and "no CUDA GPU here" in done.stderr


def test_the_suites_block_kernels_are_one_call_in_turn() -> None:
    """``gpu_suite.block_kernels`` on CPU tensors (the codecs' CPU kernels): run in order they are one call's steps
    on one framed row, so the accumulate's result (+-weights) and the decode's (+-decoded scales) are the same."""
    suite = bench_script("gpu_suite.py")
    gen = torch.Generator().manual_seed(3)
    x, err, out = torch.randn(4160, generator=gen), torch.randn(4160, generator=gen), torch.empty(4160)
    steps = suite.block_kernels(x, err, out)
    for name, (fn, per_element, _) in steps.items():
        fn()
        assert per_element > 0
        if name == "accumulate, block weights":
            accumulated = out.clone()
    assert torch.equal(accumulated, out) and bool((out != 0).all())


def test_the_suites_flat_kernels_and_worker_step_run_on_cpu_tensors() -> None:
    """Every call ``gpu_suite.flat_kernels`` and ``fused_worker`` time runs on CPU tensors (the codecs' CPU kernels),
    so a codec's changed signature fails here rather than on a lent GPU machine; the read-back variants return the
    sum the queued ones leave on the device (on the CPU, the same float)."""
    suite = bench_script("gpu_suite.py")
    gen = torch.Generator().manual_seed(5)
    x, err = torch.randn(8200, generator=gen), torch.randn(8200, generator=gen)
    bits, out = torch.empty(8200 // 8, dtype=torch.uint8), torch.empty(8200)
    kernels = suite.flat_kernels(x, err, bits, out)
    assert {"sum of squares (x + err)", "compensate + encode", "accumulate, lanes only",
            "randomized encode"} <= set(kernels)
    for name, (fn, per_element, read) in kernels.items():
        fn()
        assert per_element > 0
        if read is not None:
            assert read() == fn()
    suite.fused_worker(x, err, bits, read=True)
    assert bool((bits != 0).any())


@pytest.mark.parametrize("block_size", [None, 64])
def test_the_graphs_call_parts_make_a_whole_call_on_cpu_tensors(block_size: int | None) -> None:
    """``gpu_graphs.call_parts`` (a plan's agreement part, then its device part, which the GPU run captures in a CUDA
    graph) on CPU tensors gives ``compressed_allreduce``'s result and error buffers bit for bit, over three calls: the
    benchmark keeps up with the plans' methods without a GPU."""
    graphs = bench_script("gpu_graphs.py")
    gen = torch.Generator().manual_seed(7)
    numel = 4160
    errors = [torch.zeros(numel) for _ in range(4)]
    comm = compcoll.SingleComm()
    for _ in range(3):
        x = torch.randn(numel, generator=gen)
        out, expected = torch.empty(numel), torch.empty(numel)
        agree, finish = graphs.call_parts(x, errors[0], comm, block_size)
        finish(x, errors[0], errors[1], agree(), out)
        compcoll.compressed_allreduce(x, errors[2], errors[3], comm, out=expected, block_size=block_size, pieces=1)
        assert torch.equal(out, expected) and bool((out != 0).all())
        assert all(torch.equal(a, b) for a, b in zip(errors[:2], errors[2:]))
