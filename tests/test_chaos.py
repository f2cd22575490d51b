"""The chaos run: 4 ranks, random per-rank faults in 500 calls of each collective and optimizer, nothing lost."""

from __future__ import annotations

import pytest

from compcoll.launcher import BACKENDS, run


@pytest.mark.parametrize("backend", BACKENDS)
def test_faults_leave_every_rank_in_step_and_the_state_of_a_clean_run(backend: str) -> None:
    run("tests.chaos_workers:chaos", 4, backend, args=(500, 11), timeout=400, env={"COMPCOLL_TIMEOUT": "30"})
