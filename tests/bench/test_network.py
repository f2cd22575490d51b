"""The emulated-node harness of bench/network: shaped links, ranks across namespaces, cleanup."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench" / "network"))

import netns  # noqa: E402

from compcoll.launcher import run  # noqa: E402

pytestmark = pytest.mark.skipif(netns.why_unavailable() is not None, reason=str(netns.why_unavailable()))


def _namespaces() -> set[str]:
    return set(subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout.split())


def test_shaped_nodes_run_a_job_and_are_removed() -> None:
    before = _namespaces()
    with netns.emulated_nodes(2, "1gbit") as nodes:
        for node in nodes:
            qdisc = subprocess.run([*node.prefix(), "tc", "qdisc", "show", "dev", node.interface],
                                   capture_output=True, text=True, check=True).stdout
            assert "tbf" in qdisc and "1Gbit" in qdisc, qdisc
        assert netns.link_rate_gbit(nodes[0], nodes[1], megabytes=8) > 0
        run("tests.algorithms.onebit_workers:numerics", 2, "gloo", args=([[37], [12289]], 2),
            rank_prefix=[node.prefix() for node in nodes],
            rank_env=[node.gloo_env() for node in nodes],
            master_addr=nodes[0].address)
        assert {node.namespace for node in nodes} <= _namespaces()
    assert _namespaces() == before


def test_namespaces_are_removed_after_an_error() -> None:
    before = _namespaces()
    with pytest.raises(RuntimeError, match="inside"):
        with netns.emulated_nodes(2, None):
            raise RuntimeError("inside")
    assert _namespaces() == before


def _sent_through(node: netns.Node) -> int:
    """Bytes the tbf qdisc on the node's link has sent."""
    stats = subprocess.run([*node.prefix(), "tc", "-s", "qdisc", "show", "dev", node.interface],
                           capture_output=True, text=True, check=True).stdout
    return int(stats.split("Sent ")[1].split()[0])


def test_mpi_ranks_on_two_nodes_send_through_the_shaped_link() -> None:
    with netns.emulated_nodes(2, "1gbit") as nodes:
        before = [_sent_through(node) for node in nodes]
        run("tests.bench.network_workers:exchange", 2, "mpi", args=(4 << 20,),
            rank_prefix=[node.prefix() for node in nodes], rank_env=[node.mpi_env() for node in nodes])
        crossed = [_sent_through(node) - b for node, b in zip(nodes, before)]
    assert all(c >= 4 << 20 for c in crossed), f"only {crossed} bytes crossed the links: shared memory was used"


def test_rate_bits() -> None:
    assert netns.rate_bits("1gbit") == 1e9 and netns.rate_bits("100mbit") == 1e8 and netns.rate_bits("10Gbit") == 1e10
    with pytest.raises(ValueError, match="must end in"):
        netns.rate_bits("1gbps")


def test_scenario_counts_what_the_link_carries_for_every_method(tmp_path: Path) -> None:
    """2 nodes x 1 Gloo rank at 1 Gbit/s: every method verified, the link's bytes counted,
    then the suite's plots and the model's validation read the report."""
    import plot
    import scenario

    from compcoll.bench.model_cli import calibrate, validate

    args = ["-b", "256K", "-e", "256K", "-n", "1", "-r", "2", "-w", "1", "--methods", "plain,1bit,fp16,powersgd"]
    table, report = scenario.run_scenario("1gbit", 2, 1, "gloo", args, threads=1, timeout=300)
    assert "powersgd" in table and report["link_goodput_gbit"] > 0.5 and report["threads_per_rank"] == 1
    (row,) = report["rows"]
    for name in ("plain", "1bit", "fp16", "powersgd"):
        assert row[name]["wrong"] == 0, name
    assert row["plain"]["nic_tx_bytes"] >= 256 << 10
    assert 25 < row["1bit"]["nic_ratio"] <= 34 and 1.8 < row["fp16"]["nic_ratio"] < 2.2
    scenario.write(tmp_path / "gloo_1gbit_2x1", "test", table, report)
    assert {p.name for p in plot.plot_directory(tmp_path)} == {"time_vs_size.png", "speedup_vs_bandwidth.png"}
    assert all((tmp_path / name).stat().st_size > 10_000 for name in ("time_vs_size.png", "speedup_vs_bandwidth.png"))
    (tmp_path / "kernels.json").write_text(json.dumps({"1": calibrate(1, 1 << 20, runs=3)}))
    text, result = validate(tmp_path, 1 << 18)
    assert result["summary"]["all"]["points"] == 2 and "gloo_1gbit_2x1" in text


def test_progress_probe_times_every_mode_on_both_backends() -> None:
    """The progress probe: 2 nodes x 1 rank at 1 Gbit/s, every mode timed per backend and size."""
    import progress

    table, report = progress.probe_link("1gbit", [4096, 65536], 2, ["gloo", "mpi"])
    for backend in ("gloo", "mpi"):
        assert [row["bytes"] for row in report[backend]] == [4096, 65536]
        for row in report[backend]:
            assert all(row[f"{mode} ms"] >= 0 and row[f"start ({mode}) ms"] > 0 for mode in progress.MODES), row
        assert table.count(f"  {backend:>8} ") == 2


def test_suite_methods_per_layout() -> None:
    import suite

    assert suite.layouts("2x1,2x2") == [(2, 1), (2, 2)]
    assert suite.methods_for("gloo", 1) == "plain,1bit-wire,1bit-serial,1bit,fp16,powersgd"
    assert suite.methods_for("gloo", 2) == "plain,1bit-wire,1bit-serial,1bit,hier,fp16,powersgd"
    assert suite.methods_for("mpi", 2) == "plain,1bit-wire,1bit-serial,1bit,hier"


_INTERRUPTED_JOB = """
import sys
import time
sys.path.insert(0, {network!r})
import netns
from compcoll.launcher import run
with netns.emulated_nodes(2, "1gbit") as nodes:
    print("up", flush=True)
    run("tests.bench.network_workers:sleep", 2, "gloo", args=(120, {ready!r}), timeout=300,
        rank_prefix=[n.prefix() for n in nodes], rank_env=[n.gloo_env() for n in nodes], master_addr=nodes[0].address)
"""


def test_sigterm_removes_the_namespaces_and_kills_the_ranks(tmp_path: Path) -> None:
    """SIGTERM once both ranks run their body (each has made its file ``ready.<rank>``)."""
    before = _namespaces()
    ready = tmp_path / "ready"
    code = _INTERRUPTED_JOB.format(network=str(Path(netns.__file__).parent), ready=str(ready))
    job = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True,
                           cwd=Path(__file__).resolve().parents[2])
    try:
        assert job.stdout.readline().strip() == "up"
        deadline = time.monotonic() + 120
        while not all(Path(f"{ready}.{rank}").exists() for rank in range(2)) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert all(Path(f"{ready}.{rank}").exists() for rank in range(2)), "the ranks never reached their body"
        assert len(_namespaces() - before) == 3
        job.terminate()
        assert job.wait(timeout=60) == 143
    finally:
        job.kill()
    assert _namespaces() == before
    ranks = subprocess.run(["pgrep", "-f", "network_workers:sleep"], capture_output=True, text=True).stdout
    assert ranks == "", f"ranks left running: {ranks}"
