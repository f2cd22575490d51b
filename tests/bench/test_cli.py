"""The benchmark CLI runs on local ranks, verifies its results and writes JSON."""

from __future__ import annotations

import functools
import json
import os
import sys
from pathlib import Path

import pytest

from compcoll.bench.cli import parser, parse_size, sizes
from tests import background


def test_parse_size_and_sweep() -> None:
    assert parse_size("64K") == 65536 and parse_size("16M") == 1 << 24 and parse_size("100") == 100
    assert sizes(1024, 16384, 4) == [1024, 4096, 16384]


def test_methods_option() -> None:
    assert parser().parse_args(["--methods", "1bit,hier"]).methods == ["1bit", "hier"]
    assert "no kernels (its wire time)" in " ".join(parser().format_help().split())
    for bad in ("plain,plain", "zfp", ""):
        with pytest.raises(SystemExit):
            parser().parse_args(["--methods", bad])


BACKENDS = ("mpi", "gloo")
TIMEOUT = 900
"""Seconds a test waits for its runs, which are background jobs (``tests/background.py``)."""


def sweep_on_two_local_ranks(backend: str, folder: Path) -> tuple[list[list[str]], dict[str, str]]:
    """A sweep on 2 local ranks of ``backend``, writing ``bench.json`` in the job's folder."""
    return [[sys.executable, "-m", "compcoll.bench", "-b", "4K", "-e", "16M", "-f", "64", "-n", "2", "-r", "2",
             "--methods", "plain,1bit,1bit-serial,1bit-wire", "--launch", "2", "--backend", backend,
             "--json", str(folder / "bench.json")]], dict(os.environ)


SWEEPS = {backend: functools.partial(sweep_on_two_local_ranks, backend) for backend in BACKENDS}


@pytest.mark.parametrize("backend", BACKENDS)
@background.job(*SWEEPS.values())
def test_cli_on_two_local_ranks(backend: str) -> None:
    finished = background.results(SWEEPS[backend], timeout=TIMEOUT)
    [done] = finished.outcomes
    assert done.returncode == 0, done.output + done.errors
    assert "speedup" in done.output and "compute us" in done.output
    report = json.loads((finished.folder / "bench.json").read_text())
    assert report["ranks"] == 2 and [r["size"] for r in report["rows"]] == [4096, 262144, 16 << 20]
    for row in report["rows"]:
        assert row["plain"]["wrong"] == 0 and row["1bit"]["wrong"] == 0 and row["1bit-serial"]["wrong"] == 0
        assert row["1bit"]["bytes_ratio"] > 20
        assert row["1bit"]["bytes_sent"] == row["1bit-serial"]["bytes_sent"], "pieces changed the bytes sent"
        assert row["1bit-wire"]["wrong"] == 0 and row["1bit-wire"]["bytes_sent"] == row["1bit"]["bytes_sent"]
        for name in ("plain", "1bit", "1bit-serial", "1bit-wire"):
            assert 0 < row[name]["compute_us"] <= row[name]["time_us"], name
        assert row["plain"]["bytes_sent"] == row["size"], "only the allreduce's own bytes are counted"


def hierarchical_run(folder: Path) -> tuple[list[list[str]], dict[str, str]]:
    """4 local ranks as 2 nodes x 2, writing ``bench.json`` in the job's folder."""
    return [[sys.executable, "-m", "compcoll.bench", "-b", "256K", "-e", "256K", "-n", "2", "-r", "2",
             "--methods", "plain,1bit,hier,hier-ef", "--ranks-per-node", "2", "--launch", "4",
             "--json", str(folder / "bench.json")]], dict(os.environ)


@background.job(hierarchical_run)
def test_cli_hierarchical_as_two_nodes() -> None:
    """4 local ranks as 2 nodes x 2: every method verified, intra and inter bytes split."""
    finished = background.results(hierarchical_run, timeout=TIMEOUT)
    [done] = finished.outcomes
    assert done.returncode == 0, done.output + done.errors
    assert "inter(B)" in done.output and "hier-ef" in done.output
    (row,) = json.loads((finished.folder / "bench.json").read_text())["rows"]
    assert row["ranks_per_node"] == 2
    for name in ("plain", "1bit", "hier", "hier-ef"):
        m = row[name]
        assert m["wrong"] == 0, name
        assert m["intra_bytes"] + m["inter_bytes"] == m["bytes_sent"] and m["inter_bytes"] > 0, name
    assert row["hier"]["inter_bytes"] < 0.55 * row["1bit"]["inter_bytes"]
    assert row["hier-ef"]["inter_bytes"] < 0.55 * row["1bit"]["inter_bytes"]
