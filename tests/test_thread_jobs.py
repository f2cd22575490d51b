"""Thread-world cases run as a background job: each case's output comes back, and a failure names its case and rank."""

from __future__ import annotations

import pytest

from compcoll.launcher import WorkerFailure
from tests import background
from tests.thread_jobs import Batch

WORKERS = "tests.pool_workers"
CHECKED = Batch((f"{WORKERS}:says_its_timeout", 2, ()), (f"{WORKERS}:fails_on", 3, (1,)),
                (f"{WORKERS}:says_its_timeout", 1, ()), timeout=60)


@background.job(CHECKED.make)
def test_each_case_gives_its_ranks_output_and_a_failure_names_its_case_and_rank() -> None:
    """The cases after a failed one still run; the failed one raises ``WorkerFailure`` with its rank's traceback."""
    assert CHECKED.run(f"{WORKERS}:says_its_timeout", 2, "threads").count("timeout 60 ranks per node") == 2
    with pytest.raises(WorkerFailure) as failure:
        CHECKED.run(f"{WORKERS}:fails_on", 3, "threads", args=(1,))
    message = str(failure.value)
    assert message.startswith(f"{WORKERS}:fails_on on 3 thread rank(s), args [1] (in a background job)"), message
    assert "[rank 1] FAILED" in message and "case failed on rank 1 on purpose" in message, message
    assert "[rank 0] FAILED" not in message and "[rank 2] FAILED" not in message, message
    assert CHECKED.run(f"{WORKERS}:says_its_timeout", 1, "threads").count("timeout 60") == 1
