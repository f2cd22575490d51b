"""PyTorch's fp16 and PowerSGD DDP hooks run side by side with compcoll's methods in the benchmark."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from compcoll.bench.peers import hook_bytes, matrix_shape
from compcoll.launcher import WorkerFailure
from tests.pool import run


@pytest.mark.parametrize("count", [1, 7, 16384, 12289, 1 << 20, 6 * 35])
def test_matrix_shape_is_the_squarest_factorisation(count: int) -> None:
    rows, cols = matrix_shape(count)
    assert rows * cols == count and rows <= cols
    assert not any(count % r == 0 for r in range(rows + 1, int(count**0.5) + 1))


def test_hooks_beside_compcoll_on_two_gloo_ranks(tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    cmd = [sys.executable, "-m", "compcoll.bench", "-b", "64K", "-e", "1M", "-f", "16", "-n", "2", "-r", "2",
           "--methods", "plain,1bit,fp16,powersgd", "--nic", "lo", "--launch", "2", "--backend", "gloo",
           "--json", str(out)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    text = done.stdout
    assert "powersgd" in text and "fp16" in text and "latency (4-byte allreduce)" in text
    assert "1048576 B powersgd:" in done.stderr, "rank 0's progress lines did not reach the launching process"
    report = json.loads(out.read_text())
    for row in report["rows"]:
        for name in ("plain", "1bit", "fp16", "powersgd"):
            assert row[name]["wrong"] == 0, (row["size"], name)
            assert row[name]["nic_tx_bytes"] > 0, (row["size"], name)
        assert row["fp16"]["bytes_sent"] == row["size"] // 2 and row["fp16"]["bytes_ratio"] == 2.0
        assert row["powersgd"]["bytes_sent"] == hook_bytes("powersgd", 2, row["count"], 1)
        assert row["powersgd"]["inter_bytes"] + row["powersgd"]["intra_bytes"] == row["powersgd"]["bytes_sent"]
        assert 1.8 < row["fp16"]["nic_ratio"] < 2.2, row["fp16"]
        assert row["powersgd"]["nic_ratio"] > 10, row["powersgd"]
    assert report["latency_us"] > 0


def test_hooks_refuse_a_communicator_without_a_gloo_group() -> None:
    """The benchmark's rank body on thread ranks (compcoll's own world, no torch.distributed group): every rank
    refuses PyTorch's hooks, naming what they need."""
    with pytest.raises(WorkerFailure) as failure:
        run("compcoll.bench.cli:launched", 2, "threads", args=(["-b", "4K", "-e", "4K", "--methods", "plain,fp16"],))
    report = str(failure.value)
    assert report.count("need a torch.distributed Gloo group") == 2 and "LocalComm" in report, report


def test_hook_bytes_count_a_ring_allreduce_of_what_the_hooks_reduce() -> None:
    rows, cols = matrix_shape(12289 * 4)
    assert hook_bytes("fp16", 4, 1000) == 2 * 3 * 2000 // 4
    assert hook_bytes("powersgd", 2, 12289 * 4, 2) == 4 * 2 * rows + 4 * 2 * cols
    with pytest.raises(ValueError, match="unknown peer"):
        hook_bytes("zfp", 2, 10)
