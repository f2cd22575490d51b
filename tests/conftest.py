"""Shared fixtures: compile the Numba kernels once before any rank process starts."""

from __future__ import annotations

import pytest

from compcoll.warmup import warm


@pytest.fixture(scope="session", autouse=True)
def compiled_kernels() -> None:
    """Every kernel specialisation compiled once (``compcoll.warmup``), so rank processes load them from Numba's cache."""
    warm()
