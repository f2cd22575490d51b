"""compcoll's DDP hooks on torch's multi-threaded process group: the same bits as on Gloo ranks, at 4 and 16 threads."""

from __future__ import annotations

import pytest

from compcoll.comm.topology import RANKS_PER_NODE_ENV
from tests.ddp import ddp_workers
from tests.ddp.threaded_group import run_threaded_group


def test_buckets_match_the_reference_on_four_threads() -> None:
    """DDP's real buckets through onebit_hook on 4 threads: each compressed bucket equals the numpy reference
    (gather-scatter, l2) and replicas stay identical, as on 4 Gloo ranks."""
    run_threaded_group(ddp_workers.onebit_matches_reference, 4, 4, "gather_scatter", "l2")


def test_sixteen_threads_train_with_identical_replicas() -> None:
    run_threaded_group(ddp_workers.onebit_matches_reference, 16, 3, "gather_scatter", "l2", "auto", 1, 64)


def test_the_default_layout_follows_the_nodes(monkeypatch: pytest.MonkeyPatch) -> None:
    """``ranks_per_node="auto"`` (the default): 4 threads on one host stay flat; told they are 2 nodes of 2
    (``COMPCOLL_RANKS_PER_NODE``, what hostnames say on a cluster), or asked for it (``ranks_per_node=2``, whose
    node groups must be made on the rank's own thread), the hook takes the hierarchical form and matches its
    reference, with one scale per chunk and with block scales (the default's)."""
    monkeypatch.delenv(RANKS_PER_NODE_ENV, raising=False)
    run_threaded_group(ddp_workers.onebit_matches_reference, 4, 3, "gather_scatter", "l2", "auto", 1)
    run_threaded_group(ddp_workers.onebit_matches_reference, 4, 3, "gather_scatter", "l2", 2)
    monkeypatch.setenv(RANKS_PER_NODE_ENV, "2")
    run_threaded_group(ddp_workers.onebit_matches_reference, 4, 3, "gather_scatter", "l2", "auto", 2)
    run_threaded_group(ddp_workers.onebit_matches_reference, 4, 3, "gather_scatter", "l2", "auto", 2, 64)
