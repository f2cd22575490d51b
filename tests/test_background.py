"""Background jobs run in the session's environment as collected, with their own variables set over it."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tests import background

PROBE = "COMPCOLL_BACKGROUND_PROBE"


def says_its_variables(folder: Path) -> tuple[list[list[str]], dict[str, str]]:
    """One process printing ``PROBE``, the variable this job sets, and ``PATH``."""
    names = (PROBE, "JOB_SET", "PATH")
    return [[sys.executable, "-c", f"import os; print(*(os.environ.get(name) for name in {names!r}), sep='\\n')"]], {
        "JOB_SET": "yes"}


def test_a_job_started_while_a_test_changes_the_environment_does_not_see_the_change(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Jobs start while other tests run; until 2026-12-01 a job copied ``os.environ`` as it was then, and the CUDA
    path's 2-rank cases ran under another test's ``COMPCOLL_RANKS_PER_NODE=3`` and failed."""
    monkeypatch.setenv(PROBE, "set by a test")
    [done] = background.results(says_its_variables, timeout=60).outcomes
    assert done.returncode == 0, done.errors
    assert done.output.splitlines() == ["None", "yes", background.environment()["PATH"]], done.output
