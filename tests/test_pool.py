"""The test pool: real ranks reused across cases, each case on a communicator of its own, failures named."""

from __future__ import annotations

import pytest

from compcoll.launcher import BACKENDS, WorkerFailure
from tests import pool

WORKERS = "tests.pool_workers"


@pytest.mark.parametrize("backend", BACKENDS)
def test_cases_reuse_the_ranks_and_fail_alone(backend: str) -> None:
    """A case that fails on one rank names the case and that rank; the next case runs on the same processes."""
    out = pool.run(f"{WORKERS}:says_its_rank", 3, backend)
    assert [line for line in out.splitlines() if line] == [f"rank {r} of 3" for r in range(3)]
    started = pool._pool(backend, 3)
    pids = [p.pid for p in started.procs]
    with pytest.raises(WorkerFailure) as failure:
        pool.run(f"{WORKERS}:fails_on", 3, backend, args=(1,))
    message = str(failure.value)
    assert f"{WORKERS}:fails_on on 3 {backend} rank(s) (pooled" in message and "rank(s) [1] failed" in message
    assert "case failed on rank 1 on purpose" in message and "[rank 0] FAILED" not in message
    pool.run(f"{WORKERS}:says_its_rank", 3, backend)
    assert [p.pid for p in pool._pool(backend, 3).procs] == pids


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_case_that_ends_a_rank_ends_its_pool_and_the_next_case_gets_new_ranks(backend: str) -> None:
    with pytest.raises(WorkerFailure, match=r"process\(es\) \[\d\] ended"):
        pool.run(f"{WORKERS}:ends_a_rank", 2, backend, timeout=60)
    out = pool.run(f"{WORKERS}:says_its_rank", 2, backend)
    assert "rank 1 of 2" in out


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_case_environment_applies_to_that_case_alone(backend: str) -> None:
    env = {"COMPCOLL_TIMEOUT": "7", "COMPCOLL_RANKS_PER_NODE": "1"}
    assert pool.run(f"{WORKERS}:says_its_timeout", 2, backend, env=env).count("timeout 7 ranks per node 1") == 2
    assert "ranks per node None" in pool.run(f"{WORKERS}:says_its_timeout", 2, backend)
    assert "timeout 7" not in pool.run(f"{WORKERS}:says_its_timeout", 2, backend)
