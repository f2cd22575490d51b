"""The performance model: its byte counts, its break-even points, calibration and validation."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from compcoll.bench.model import Cluster, break_even_gbit, break_even_size, link_bytes, predict
from compcoll.bench.model_cli import VERDICT_BUCKET, calibrate, predictions, parser, validate, verdict

RATES = {"plain": 5.0, "1bit": 2.0, "hier": 1.5}


def _cluster(nodes: int = 2, k: int = 2, gbit: float = 1.0) -> Cluster:
    return Cluster(nodes, k, gbit, latency_us=200.0, intra_gbyte=2.0, kernel_gbyte=RATES)


@pytest.mark.parametrize("nodes,k", [(2, 1), (2, 2), (3, 4), (16, 8)])
def test_link_bytes(nodes: int, k: int) -> None:
    p = nodes * k
    assert link_bytes("plain", nodes, k) == (2 * (p - 1) / p, 0.0)
    inter, intra = link_bytes("1bit", nodes, k)
    assert inter == pytest.approx(k * 2 * (p - k) / p / 32) and intra == pytest.approx(2 * (k - 1) / p / 32)
    hier_inter, _ = link_bytes("hier", nodes, k)
    assert hier_inter == pytest.approx(2 * (nodes - 1) / nodes / 32)
    assert hier_inter <= inter
    with pytest.raises(ValueError, match="the model knows"):
        link_bytes("zfp", nodes, k)


def test_one_node_plain_uses_the_intra_path_and_one_rank_costs_nothing() -> None:
    assert link_bytes("plain", 1, 4) == (0.0, 1.5)
    alone = predict(_cluster(1, 1), 1 << 20, "1bit")
    assert alone.inter == alone.intra == alone.latency == 0.0 and alone.kernels > 0


@pytest.mark.parametrize("method", ["1bit", "hier"])
def test_break_even_gbit_is_where_the_times_cross(method: str) -> None:
    size = 64 << 20
    gbit = break_even_gbit(_cluster(), size, method)
    assert 1.0 < gbit < 1000.0
    at = _cluster(gbit=gbit)
    assert predict(at, size, method).total == pytest.approx(predict(at, size, "plain").total, rel=1e-9)
    slower, faster = _cluster(gbit=gbit / 2), _cluster(gbit=gbit * 2)
    assert predict(slower, size, method).total < predict(slower, size, "plain").total
    assert predict(faster, size, method).total > predict(faster, size, "plain").total


def test_break_even_size_is_where_the_times_cross() -> None:
    cluster = _cluster()
    size = break_even_size(cluster, "1bit")
    assert 0 < size < 1 << 20
    assert predict(cluster, size, "1bit").total == pytest.approx(predict(cluster, size, "plain").total, rel=1e-9)
    assert predict(cluster, 2 * size, "1bit").total < predict(cluster, 2 * size, "plain").total
    assert break_even_size(Cluster(2, 1, 1e6, 200.0, 2.0, RATES), "1bit") == math.inf


def test_calibrate_measures_every_method() -> None:
    rates = calibrate(threads=1, size=1 << 20, runs=3)
    assert set(rates) == {"plain", "1bit", "hier"} and all(r > 0.01 for r in rates.values())


def test_validate_reads_reports_and_kernel_rates(tmp_path: Path) -> None:
    """A report whose times are the model's own predictions validates to zero error."""
    kernels = {"1": RATES}
    (tmp_path / "kernels.json").write_text(json.dumps(kernels))
    report = {"backend": "gloo", "ranks": 4, "ranks_per_node": 2, "nodes": 2, "threads_per_rank": 1,
              "cpu_count": 4, "link_goodput_gbit": 1.0, "latency_us": 200.0, "methods": ["plain", "1bit", "fp16"]}
    cluster = Cluster(2, 2, 1.0, 200.0, 2.0, RATES)
    report["rows"] = [{"size": s, **{m: {"time_us": predict(cluster, s, m).total * 1e6} for m in ("plain", "1bit")},
                       "fp16": {"time_us": 1.0}} for s in (1 << 20, 4 << 20)]
    (tmp_path / "gloo_1gbit_2x2.json").write_text(json.dumps(report))
    text, result = validate(tmp_path, 1 << 20)
    assert result["summary"]["all"]["points"] == 4 and result["summary"]["all"]["max"] < 0.02
    assert "fp16" not in text


def test_predictions_table() -> None:
    args = parser().parse_args(["--nodes", "16", "--gbit", "10", "--params", "300M,7B"])
    lines = [line for line in predictions(args).splitlines() if not line.startswith("#")]
    assert len(lines) == 2 and all("|" in line for line in lines)


def test_pieces_overlap_kernels_and_wire() -> None:
    cluster, size = _cluster(2, 1), 64 << 20
    serial, piped = predict(cluster, size, "1bit"), predict(cluster, size, "1bit", pieces=8)
    assert serial.total == pytest.approx(serial.latency + serial.kernels + serial.wire)
    bigger, smaller = max(serial.kernels, serial.wire), min(serial.kernels, serial.wire)
    assert piped.total == pytest.approx(serial.latency + bigger + smaller / 8)
    assert bigger < piped.total - piped.latency < serial.total - serial.latency
    with pytest.raises(ValueError, match="only 1bit runs in pieces"):
        predict(cluster, size, "hier", pieces=2)


def test_validate_models_serial_and_pipelined_rows(tmp_path: Path) -> None:
    """1bit-serial is 1bit in one piece; a row's recorded pieces are modelled as overlap."""
    (tmp_path / "kernels.json").write_text(json.dumps({"1": RATES}))
    cluster, size = Cluster(2, 1, 1.0, 200.0, 2.0, RATES), 64 << 20
    report = {"backend": "mpi", "ranks": 2, "ranks_per_node": 1, "nodes": 2, "threads_per_rank": 1, "cpu_count": 2,
              "link_goodput_gbit": 1.0, "latency_us": 200.0, "methods": ["1bit-serial", "1bit"],
              "rows": [{"size": size,
                        "1bit-serial": {"time_us": predict(cluster, size, "1bit").total * 1e6, "pieces": 1},
                        "1bit": {"time_us": predict(cluster, size, "1bit", 8).total * 1e6, "pieces": 8}}]}
    (tmp_path / "pipelined_mpi_1gbit_2x1.json").write_text(json.dumps(report))
    text, result = validate(tmp_path, 1 << 20)
    assert result["summary"]["all"]["points"] == 2 and result["summary"]["all"]["max"] < 1e-9
    assert "1bit-serial" in text


def test_overlap_split_of_a_report(tmp_path: Path) -> None:
    """bench/network/overlap.py: kernels = serial - wire, the pipelined call against max(kernels, wire)."""
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench" / "network"))
    import overlap

    row = {"size": 64 << 20, "plain": {"time_us": 600e3}, "1bit-wire": {"time_us": 20e3},
           "1bit-serial": {"time_us": 70e3, "pieces": 1}, "1bit": {"time_us": 55e3, "pieces": 8}}
    (split,) = overlap.split({"rows": [row, {"size": 4, "plain": {"time_us": 1.0}}]})
    assert split["kernels_ms"] == pytest.approx(50.0) and split["wire_ms"] == pytest.approx(20.0)
    assert split["bound_ratio"] == pytest.approx(1.1) and split["hidden"] == pytest.approx(0.75)
    path = tmp_path / "pipelined_mpi_1gbit_2x1.json"
    path.write_text(json.dumps({"rows": [row]}))
    assert "pipelined_mpi_1gbit_2x1" in overlap.table([path]) and "10.9x" in overlap.table([path])


def test_predictions_read_calibrated_rates_and_say_when_no_link_matters(tmp_path: Path) -> None:
    """--kernels reads what --calibrate wrote; one node has no link rate to break even at; counts print as given."""
    from compcoll.bench.model_cli import format_count

    assert [format_count(c) for c in (10, 300_000_000, 1_300_000_000)] == ["10", "300M", "1.3B"]
    rates = tmp_path / "kernels.json"
    rates.write_text(json.dumps({"2": {"plain": 5.0, "1bit": 0.5, "hier": 0.25}}))
    args = parser().parse_args(["--nodes", "1,2", "--ranks-per-node", "8", "--gbit", "10", "--params", "10,1.3B",
                                "--kernels", str(rates), "--threads", "2"])
    text = predictions(args)
    assert "1bit 0.5" in text and "1.3B" in text and "e-08" not in text
    rows = [line.split("|") for line in text.splitlines() if not line.startswith("#")]
    one_node = [row for row in rows if row[0].split()[0] == "1"]
    assert one_node and all(row[3].split() == ["-", "-"] for row in one_node)
    with pytest.raises(SystemExit, match="not --threads 1"):
        predictions(parser().parse_args(["--kernels", str(rates)]))


def test_verdict_says_where_one_bit_stops_paying() -> None:
    """The demo's verdict: six clusters, each line's speed-up is plain's predicted time over 1-bit's, and the rate it
    names is where the two cross."""
    rates = {"plain": 13.0, "1bit": 1.2, "hier": 0.3}
    lines = verdict(rates, 50.0, 100.0).splitlines()
    assert len(lines) == 7 and lines[0].startswith("# verdict for a 25 MB bucket"), lines
    for line, (nodes, gbit) in zip(lines[1:], [(n, g) for n in (2, 16) for g in (1.0, 10.0, 100.0)]):
        cluster = Cluster(nodes, 1, gbit, 50.0, 100.0, rates)
        plain, onebit = (predict(cluster, VERDICT_BUCKET, m).total for m in ("plain", "1bit"))
        even = break_even_gbit(cluster, VERDICT_BUCKET, "1bit")
        assert f"{plain / onebit:5.2f}x {'faster' if onebit < plain else 'slower'}" in line, line
        assert f"pays below {even:.3g} Gbit/s" in line and (onebit < plain) == (gbit < even), line
