"""compcoll.ddp.onebit_hook under real DDP on 1-4 Gloo ranks: the reference per bucket, exact resume, NaN steps."""

from __future__ import annotations

import pytest

from compcoll.launcher import run

WORKERS = "tests.ddp.ddp_workers"


@pytest.mark.parametrize("world_size", [1, 2, 3, 4])
def test_buckets_match_the_reference(world_size: int) -> None:
    run(f"{WORKERS}:onebit_matches_reference", world_size, "gloo", args=(5, "allgather", "l1"))


def test_gather_scatter_with_the_l2_scale_matches_the_reference() -> None:
    run(f"{WORKERS}:onebit_matches_reference", 3, "gloo", args=(4, "gather_scatter", "l2"))


def test_hierarchical_form_matches_the_reference() -> None:
    run(f"{WORKERS}:onebit_matches_reference", 4, "gloo", args=(4, "allgather", "l2", 2))


@pytest.mark.parametrize("world_size", [2, 3])
def test_resume_is_exact(world_size: int) -> None:
    run(f"{WORKERS}:onebit_resumes_exactly", world_size, "gloo")


def test_hierarchical_resume_is_exact() -> None:
    run(f"{WORKERS}:onebit_resumes_exactly", 4, "gloo", args=(2,))


def test_a_nan_skips_the_step_on_every_rank() -> None:
    run(f"{WORKERS}:nan_skips_on_every_rank", 3, "gloo")
