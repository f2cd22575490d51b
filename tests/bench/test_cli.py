"""The benchmark CLI runs on local ranks, verifies its results and writes JSON."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from compcoll.bench.cli import parse_size, sizes


def test_parse_size_and_sweep() -> None:
    assert parse_size("64K") == 65536 and parse_size("16M") == 1 << 24 and parse_size("100") == 100
    assert sizes(1024, 16384, 4) == [1024, 4096, 16384]


@pytest.mark.parametrize("backend", ["mpi", "gloo"])
def test_cli_on_two_local_ranks(backend: str, tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    cmd = [sys.executable, "-m", "compcoll.bench", "-b", "4K", "-e", "64K", "-f", "16", "-n", "2", "-r", "2",
           "--launch", "2", "--backend", backend, "--json", str(out)]
    text = subprocess.run(cmd, capture_output=True, text=True, timeout=300, check=True).stdout
    assert "speedup" in text
    report = json.loads(out.read_text())
    assert report["ranks"] == 2 and [r["size"] for r in report["rows"]] == [4096, 65536]
    for row in report["rows"]:
        assert row["plain"]["wrong"] == 0 and row["1bit"]["wrong"] == 0
        assert row["compression"] > 20
