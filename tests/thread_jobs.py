"""Long thread-world cases run as a background job (``tests/background.py``), on the CPU the tests leave idle.

A test whose thread-world cases take seconds of one core each declares them as a ``Batch`` and owns its job
(``@background.job(BATCH.make)``); it then calls ``BATCH.run``, which has ``tests.pool.run``'s signature: a case
the batch holds reads its outcome from the job (``WorkerFailure`` naming the case and each failed rank, as the
test process's own run would raise), any other goes to ``tests.pool.run`` as before.

Usage (what a batch's job runs): ``python -m tests.thread_jobs TIMEOUT '<JSON list of [target, world_size, args]>'``.
1. Keep this process on the highest CPU it may use: the test process's own thread worlds run on the lowest
   (``launcher.run_threads(one_cpu=True)``), so a job's ranks and theirs do not take turns on one CPU while the
   other is idle.
2. Run each case with ``launcher.run_threads(one_cpu=True)``, as ``tests.pool.run`` does, one after another.
3. Print, for each case, a ``MARK`` line naming it, its ranks' output and ``PASSED``, or the failure and
   ``FAILED``.
"""

from __future__ import annotations

import json
import os
import sys
import traceback
from pathlib import Path

from compcoll import launcher
from compcoll.launcher import WorkerFailure
from tests import background, pool

MARK = "=== tests.thread_jobs: "
"""The line in front of each case's outcome."""
PASSED, FAILED = "=== passed", "=== failed"


def _key(target: str, world_size: int, args: tuple | list) -> str:
    return f"{target} on {world_size} thread rank(s), args {json.dumps(list(args))}"


class Batch:
    """Thread-world cases (target, world_size, args) of one test, run one after another in one background job."""

    def __init__(self, *cases: tuple[str, int, tuple], timeout: float = 180.0) -> None:
        self.cases = [(target, world_size, json.loads(json.dumps(list(args)))) for target, world_size, args in cases]
        self.keys = {_key(*case) for case in self.cases}
        self.timeout = timeout

        def make(folder: Path) -> tuple[list[list[str]], dict[str, str]]:
            """One process running every case of the batch (``main``), each within ``timeout`` seconds."""
            return ([[sys.executable, "-m", "tests.thread_jobs", str(timeout), json.dumps(self.cases)]],
                    {})

        self.make: background.Maker = make

    def run(self, target: str, world_size: int, backend: str = "mpi", *, args: tuple = (), **rest) -> str:
        """``tests.pool.run``; a case this batch holds gives the job's outcome (its ranks' output, or
        ``WorkerFailure`` with the failure the job printed)."""
        key = _key(target, world_size, args)
        if backend != "threads" or key not in self.keys:
            return pool.run(target, world_size, backend, args=args, **rest)
        [done] = background.results(self.make, timeout=len(self.cases) * self.timeout).outcomes
        sections = dict(part.split("\n", 1) for part in done.output.split(MARK)[1:])
        section = sections.get(key)
        if section is None:
            raise WorkerFailure(f"{key}: the job ended before the case (code {done.returncode})\n"
                                f"{done.output[-5000:]}{done.errors[-20000:]}")
        body, _, verdict = section.rstrip("\n").rpartition("\n")
        if verdict != PASSED:
            raise WorkerFailure(f"{key} (in a background job): {body}")
        return body


def main(timeout: float, cases: list[list]) -> None:
    """Run ``cases``, each within ``timeout`` seconds (module docstring, steps 1-3)."""
    os.sched_setaffinity(0, {max(os.sched_getaffinity(0))})
    for target, world_size, args in cases:
        print(f"{MARK}{_key(target, world_size, args)}", flush=True)
        try:
            print(launcher.run_threads(target, world_size, args=tuple(args), timeout=timeout, one_cpu=True))
            print(PASSED, flush=True)
        except Exception:
            print(traceback.format_exc())
            print(FAILED, flush=True)


if __name__ == "__main__":
    main(float(sys.argv[1]), json.loads(sys.argv[2]))
