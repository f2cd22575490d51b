"""The chaos run: 4 ranks, random per-rank faults in each collective and optimizer's calls, nothing lost."""

from __future__ import annotations

import pytest

from tests.optim.optim_workers import CONFIGS
from tests.pool import run


@pytest.mark.parametrize("backend, calls, configs", [
    pytest.param("mpi", 250, list(CONFIGS), id="mpi-250"),
    pytest.param("gloo", 100, [c for c in CONFIGS if c != "OneBitLamb layers"], id="gloo-100"),
])
def test_faults_leave_every_rank_in_step_and_the_state_of_a_clean_run(backend: str, calls: int,
                                                                      configs: list[str]) -> None:
    """250 calls on MPI (25 NaN, 24 bad and 19 late calls in each series: compressed_allreduce and every optimizer
    configuration); 100 on Gloo, whose calls take 2.5 times as long (6, 10 and 9), less 1-bit LAMB with a scale per
    layer (a compressed_allreduce per parameter: 3.7 times 1-bit LAMB's time, 40% of the run; on MPI above)."""
    run("tests.chaos_workers:chaos", 4, backend, args=(calls, 11, configs), timeout=400,
        env={"COMPCOLL_TIMEOUT": "30"})
