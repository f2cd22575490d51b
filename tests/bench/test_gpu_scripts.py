"""The GPU run's benchmarks (bench/gpu_suite.py, gpu_graphs.py, gpu_host_profile.py) checked without a GPU.

They import without one, their calls of the codecs and plans run on CPU tensors (so a broken import or a changed
signature shows here, not on a lent GPU machine), and the suite refuses to run without one.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import compcoll
from compcoll.bench.launches import PROTOCOLS
from compcoll.bench.one_rank import one_rank_comm
from tests.bench import ROOT, bench_script


@pytest.mark.parametrize("name", ["gpu_suite", "gpu_graphs", "gpu_host_profile", "gpu_ncu"])
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
    assert {"sum of squares (x + err)", "compensate + encode", "accumulate, lanes only", "randomized encode",
            "accumulate signs (16 rows)", "accumulate, block weights (16 rows)", "accumulate levels (16 rows, 4 bits)",
            "decode levels (16 rows, 4 bits)", "accumulate groups (4 of 4 rows)"} <= set(kernels)
    for name, (fn, per_element, read) in kernels.items():
        fn()
        assert per_element > 0
        if read is not None:
            assert read() == fn()
    suite.fused_worker(x, err, bits, read=True)
    assert bool((bits != 0).any())


def test_ncus_run_names_every_suite_kernel_and_its_launches_in_order(tmp_path: Path) -> None:
    """``bench/gpu_ncu.py`` on meta tensors (the CUDA path counted, nothing run): every kernel the suite times, in
    the suite's order, each with the launches of its call (a GPU's: tests/gpu checks meta's counts; 140000 elements
    code their block scales in two), which the summary then gives ncu's rows in turn."""
    names = tmp_path / "names.json"
    done = subprocess.run([sys.executable, str(ROOT / "bench" / "gpu_ncu.py"), "--device", "meta", "--numel", "140000",
                           "--names", str(names)], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    launched = json.loads(names.read_text())
    gen = torch.Generator().manual_seed(1)
    x, err = torch.randn(4160, generator=gen), torch.randn(4160, generator=gen)
    suite = bench_script("gpu_suite.py").flat_kernels(x, err, torch.empty(520, dtype=torch.uint8), torch.empty(4160))
    assert [name for name, _ in launched] == list(suite)
    assert all(count >= 1 for _, count in launched) and dict(launched)["code block scales"] == 2, launched


def test_the_ncu_summary_gives_each_launch_its_suite_name(tmp_path: Path) -> None:
    """``gpu_ncu.summary`` on a report in ncu's CSV details layout (a row per metric of each launch; ncu's own
    lines before it): launch i takes the i-th name of the suite's calls, with its duration's unit and the metrics
    it has; a report with another number of launches is flagged."""
    ncu = bench_script("gpu_ncu.py")
    header = ("ID", "Process ID", "Process Name", "Host Name", "Kernel Name", "Context", "Stream", "Block Size",
              "Grid Size", "Device", "CC", "Section Name", "Metric Name", "Metric Unit", "Metric Value")
    rows = [(0, "_power_lanes(float *, ...)", "GPU Speed Of Light Throughput", "Duration", "us", "89.70"),
            (0, "_power_lanes(float *, ...)", "GPU Speed Of Light Throughput", "DRAM Throughput", "%", "48.10"),
            (1, "_absmax_lanes(float *, ...)", "Occupancy", "Achieved Occupancy", "%", "71.25"),
            (2, "_head_weights(float *, ...)", "GPU Speed Of Light Throughput", "Duration", "us", "3.10")]
    lines = ["==PROF== Connected to process 1 (python)", ",".join(f'"{h}"' for h in header)]
    for i, kernel, section, metric, unit, value in rows:
        fields = (i, 1, "python", "h", kernel, 1, 7, "(256, 1, 1)", "(128, 1, 1)", 0, "9.0", section, metric, unit,
                  value)
        lines.append(",".join(f'"{v}"' for v in fields))
    report = tmp_path / "ncu.csv"
    report.write_text("\n".join(lines) + "\n")
    table = ncu.summary(report, [("sum of squares (x + err)", 1), ("row max |x|", 1), ("unframe", 1)])
    assert table[1].startswith("sum of squares (x + err)") and "89.70 us" in table[1] and "48.10" in table[1]
    assert table[2].startswith("row max |x|") and "71.25" in table[2]
    assert table[3].startswith("unframe") and "3.10 us" in table[3]
    assert ncu.summary(report, [("sum of squares (x + err)", 1)])[0].startswith("# 3 launches in the report, 1")


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


def test_the_suite_reads_issue_39s_aims_from_its_results() -> None:
    """``gpu_suite.aims`` on the H200's run of 2026-12-04 (bench/results) says what that run's note said, every
    kernel below half of copy named with its smallest fraction; the host's own time beside the host time where the
    rows have it (runs since 2026-12-06), the verdict still the host time's; the same rows made to pass read "met",
    and rows of sizes outside an aim's range "not measured"."""
    suite = bench_script("gpu_suite.py")
    rows = json.loads((ROOT / "bench" / "results" / "gpu_kernels_h200_f15d93e.json").read_text())["results"]["bound"]
    host, kernels, worker = suite.aims(rows)
    assert host.endswith("192.1-470.4 us, not met")
    assert "2 of 13 kernels" in kernels and "randomized encode 0.16, accumulate signs (1 row) 0.17" in kernels
    assert kernels.endswith("encode, block scales 0.49, not met") and "compensate + encode" not in kernels
    assert worker.endswith("1.88-2.63x, not met")
    for r in rows:
        r["compressed_allreduce_own_host_s"] = r["compressed_allreduce_host_s"] / 4
    assert suite.aims(rows)[0].endswith("192.1-470.4 us, the host's own (its wait's time out) 48.0-117.6 us, not met")
    for r in rows:
        r["compressed_allreduce_host_s"] = 99e-6
        r["worker_step"]["speedup"] = 2.0
        for k in r["kernels"].values():
            k["of_copy"] = 0.5
    assert [line.rsplit(", ", 1)[-1] for line in suite.aims(rows)] == ["met"] * 3
    assert suite.aims(rows)[1].endswith("13 of 13 kernels; below: none, met")
    assert [line.rsplit(": ", 1)[-1] for line in suite.aims(rows[:1])][1:] == ["not measured"] * 2


def test_the_host_profiles_forms_table_runs_on_cpu_tensors() -> None:
    """``gpu_host_profile.forms_table`` on CPU tensors (the CPU kernels), over a one-rank communicator with its rounds
    on the host and one with them on the device (NCCL's path, as ``--comms nccl`` is on a GPU): a row of two host
    times for every protocol, no call failed."""
    lines = bench_script("gpu_host_profile.py").forms_table(
        4096, {kind: one_rank_comm(kind) for kind in ("single-host", "single")}, torch.device("cpu"), lambda: None,
        2, 1)
    rows = {line.split()[0]: line.split()[1:] for line in lines[2:]}
    assert set(rows) == set(PROTOCOLS), lines
    assert all(len(times) == 2 and all(float(t) > 0 for t in times) for times in rows.values()), lines
