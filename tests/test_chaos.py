"""The chaos run: 4 ranks, random per-rank faults in each collective and optimizer's calls, nothing lost."""

from __future__ import annotations

import pytest

from compcoll.launcher import run


@pytest.mark.parametrize("backend, calls", [("mpi", 500), ("gloo", 200)])
def test_faults_leave_every_rank_in_step_and_the_state_of_a_clean_run(backend: str, calls: int) -> None:
    """500 calls on MPI; 200 on Gloo, whose calls take 2.5 times as long (about 20 faults of each kind there)."""
    run("tests.chaos_workers:chaos", 4, backend, args=(calls, 11), timeout=400, env={"COMPCOLL_TIMEOUT": "30"})
