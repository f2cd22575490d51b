"""Shared fixtures: compile the Numba kernels once before any rank process starts; start the background jobs."""

from __future__ import annotations

import pytest

from compcoll.warmup import warm
from tests import background


@pytest.fixture(scope="session", autouse=True)
def compiled_kernels() -> None:
    """Every kernel specialisation compiled once (``compcoll.warmup``), so rank processes load them from Numba's cache."""
    warm()


def pytest_collection_finish(session: pytest.Session) -> None:
    """Start the background jobs (``tests/background.py``) of the tests collected."""
    for item in session.items:
        make = getattr(getattr(item, "function", None), "background_job", None)
        if make is not None:
            background.start(make)
