"""The process groups compcoll makes over Gloo end with the communicators that use them (real Gloo ranks)."""

from __future__ import annotations

from tests.pool import run


def test_made_groups_end_with_their_communicators() -> None:
    run("tests.comm.comm_workers:made_groups_end_with_their_communicators", 3, "gloo", timeout=90)
