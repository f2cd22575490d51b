"""The emulated-node harness of bench/network: shaped links, ranks across namespaces, cleanup."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench" / "network"))

import netns  # noqa: E402

from compcoll.testing import run  # noqa: E402

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

