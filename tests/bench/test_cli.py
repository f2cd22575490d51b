"""The benchmark CLI runs on local ranks, verifies its results and writes JSON."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from compcoll.bench.cli import parser, sizes
from tests.pool import run

LAUNCH = [sys.executable, "-m", "compcoll.bench"]
BODY = "compcoll.bench.cli:launched"


def test_sweep() -> None:
    assert sizes(1024, 16384, 4) == [1024, 4096, 16384]


def test_methods_option() -> None:
    assert parser().parse_args(["--methods", "1bit,hier"]).methods == ["1bit", "hier"]
    assert "no kernels (its wire time)" in " ".join(parser().format_help().split())
    for bad in ("plain,plain", "zfp", ""):
        with pytest.raises(SystemExit):
            parser().parse_args(["--methods", bad])


@pytest.mark.parametrize("backend", ["mpi", "gloo"])
def test_cli_on_two_local_ranks(backend: str, tmp_path: Path) -> None:
    """On MPI the command as a user types it (``--launch 2``: the CLI starts its ranks); on Gloo the benchmark's rank
    body with the same arguments on 2 pooled ranks (the Gloo launch itself: tests/bench/test_peers.py)."""
    out = tmp_path / "bench.json"
    options = ["-b", "4K", "-e", "16M", "-f", "64", "-n", "2", "-r", "2",
               "--methods", "plain,1bit,1bit-serial,1bit-wire", "--json", str(out)]
    if backend == "mpi":
        done = subprocess.run([*LAUNCH, *options, "--launch", "2", "--backend", backend], capture_output=True,
                              text=True, timeout=300)
        assert done.returncode == 0, done.stdout + done.stderr
        text = done.stdout
    else:
        text = run(BODY, 2, backend, args=(options + ["--quiet"],), timeout=300)
    assert "speedup" in text and "compute us" in text
    report = json.loads(out.read_text())
    assert report["ranks"] == 2 and [r["size"] for r in report["rows"]] == [4096, 262144, 16 << 20]
    for row in report["rows"]:
        assert row["plain"]["wrong"] == 0 and row["1bit"]["wrong"] == 0 and row["1bit-serial"]["wrong"] == 0
        assert row["1bit"]["bytes_ratio"] > 20
        assert row["1bit"]["bytes_sent"] == row["1bit-serial"]["bytes_sent"], "pieces changed the bytes sent"
        assert row["1bit-wire"]["wrong"] == 0 and row["1bit-wire"]["bytes_sent"] == row["1bit"]["bytes_sent"]
        for name in ("plain", "1bit", "1bit-serial", "1bit-wire"):
            assert 0 < row[name]["compute_us"] <= row[name]["time_us"], name
        assert row["plain"]["bytes_sent"] == row["size"], "only the allreduce's own bytes are counted"


def test_cli_hierarchical_as_two_nodes(tmp_path: Path) -> None:
    """4 ranks as 2 nodes x 2 (``--ranks-per-node 2``; the benchmark's rank body on 4 pooled MPI ranks): every method
    verified, intra and inter bytes split."""
    out = tmp_path / "bench.json"
    options = ["-b", "256K", "-e", "256K", "-n", "2", "-r", "2", "--methods", "plain,1bit,hier,hier-ef",
               "--ranks-per-node", "2", "--json", str(out), "--quiet"]
    text = run(BODY, 4, "mpi", args=(options,), timeout=300)
    assert "inter(B)" in text and "hier-ef" in text
    (row,) = json.loads(out.read_text())["rows"]
    assert row["ranks_per_node"] == 2
    for name in ("plain", "1bit", "hier", "hier-ef"):
        m = row[name]
        assert m["wrong"] == 0, name
        assert m["intra_bytes"] + m["inter_bytes"] == m["bytes_sent"] and m["inter_bytes"] > 0, name
    assert row["hier"]["inter_bytes"] < 0.55 * row["1bit"]["inter_bytes"]
    assert row["hier-ef"]["inter_bytes"] < 0.55 * row["1bit"]["inter_bytes"]
