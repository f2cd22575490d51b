"""compcoll.ddp.birder_hook under real DDP on Gloo ranks: Birder's reference per bucket, replicas identical."""

from __future__ import annotations

import pytest

from compcoll.launcher import run

WORKERS = "tests.ddp.ddp_workers"


@pytest.mark.parametrize("world_size", [1, 2, 4])
def test_buckets_match_the_reference(world_size: int) -> None:
    run(f"{WORKERS}:birder_matches_reference", world_size, "gloo", args=(3,))
