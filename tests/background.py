"""Long one-process checks run at the lowest CPU priority from the moment the session's tests are collected, so
that they use the cores the other tests leave idle; the test that owns one collects its result.

A test marks itself with ``@job(make)``, where ``make()`` returns the commands (run side by side) and their
environment; ``tests/conftest.py`` starts the jobs of the collected tests, and the test calls ``results(make)``,
which starts its job then if nothing had (a test run on its own) and waits for it.
"""

from __future__ import annotations

import atexit
import subprocess
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parents[1]
Maker = Callable[[], tuple[list[list[str]], dict[str, str]]]
_JOBS: dict[Maker, tuple[list[subprocess.Popen], dict[str, str]]] = {}


def job(make: Maker) -> Callable:
    """Mark a test as owning the job ``make`` describes."""
    def mark(test: Callable) -> Callable:
        test.background_job = make
        return test
    return mark


def start(make: Maker) -> None:
    """Start ``make``'s commands under ``nice -n 19`` in the repository, output captured, unless they run already."""
    if make not in _JOBS:
        commands, env = make()
        _JOBS[make] = ([subprocess.Popen(["nice", "-n", "19", *command], cwd=ROOT, env=env, text=True,
                                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT) for command in commands],
                       env)


def results(make: Maker, timeout: float) -> tuple[list[tuple[int, str]], dict[str, str]]:
    """Each of ``make``'s commands' (return code, output), waited for up to ``timeout`` seconds, and their
    environment."""
    start(make)
    processes, env = _JOBS.pop(make)
    try:
        outcomes = []
        for process in processes:
            output, _ = process.communicate(timeout=timeout)
            outcomes.append((process.returncode, output))
        return outcomes, env
    finally:
        _stop(processes)


def _stop(processes: list[subprocess.Popen]) -> None:
    for process in processes:
        process.kill()
        process.wait()


@atexit.register
def _stop_all() -> None:
    """Stop the jobs whose tests never ran (a session stopped early)."""
    while _JOBS:
        _stop(_JOBS.popitem()[1][0])
