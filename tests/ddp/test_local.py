"""compcoll.ddp.local_hook leaves every rank's gradients its own under real DDP."""

from __future__ import annotations

from tests.pool import run


def test_gradients_stay_local() -> None:
    run("tests.ddp.ddp_workers:local_hook_keeps_gradients", 2, "gloo")
