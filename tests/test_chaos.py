"""The chaos run: 4 ranks, random per-rank faults in each collective and optimizer's calls, nothing lost."""

from __future__ import annotations

import pytest

from tests.pool import run


@pytest.mark.parametrize("backend, calls", [("mpi", 250), ("gloo", 100)])
def test_faults_leave_every_rank_in_step_and_the_state_of_a_clean_run(backend: str, calls: int) -> None:
    """250 calls on MPI (25 NaN, 24 bad and 19 late calls in each of the five series); 100 on Gloo, whose calls
    take 2.5 times as long (6, 10 and 9)."""
    run("tests.chaos_workers:chaos", 4, backend, args=(calls, 11), timeout=400, env={"COMPCOLL_TIMEOUT": "30"})
