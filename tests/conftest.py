"""Shared fixtures: kernels and bytecode compiled first; background jobs queued; idle test pools watched.

The kernels and the bytecode are compiled before any rank process starts; the pools are watched for spinning while
idle.
"""

from __future__ import annotations

import compileall
import gc
from typing import Callable, Iterator

import pytest

from compcoll.kernels import launch
from compcoll.warmup import warm
from tests import background, pool

SOURCES = ("compcoll", "tests", "examples", "bench")
"""The project's Python folders whose bytecode ``compiled_kernels`` writes."""


@pytest.fixture(scope="session", autouse=True)
def compiled_kernels() -> None:
    """Every kernel specialisation compiled once (``compcoll.warmup``), so rank processes load them from Numba's cache,
    and the project's modules compiled to bytecode, which a process where ``PYTHONDONTWRITEBYTECODE`` is set reads but
    never writes (0.3 s of CPU for each rank's imports, measured); then the background jobs that load them may start.
    What this process holds by then (torch, Numba, the collected tests) is frozen (``gc.freeze``): the garbage
    collector's full passes over it took 8.5 s of this process's CPU in a whole run (26 passes)."""
    for folder in SOURCES:
        compileall.compile_dir(background.ROOT / folder, quiet=1)
    warm()
    gc.freeze()
    background.WARMED.set()


@pytest.fixture
def choose_launcher() -> Iterator[Callable[[str], None]]:
    """``choose_launcher(name)`` launches through ``name`` for the rest of the test (``kernels.launch.use_launcher``);
    the launcher asked for before is put back after it."""
    before: list[str] = []

    def choose(name: str) -> None:
        previous = launch.use_launcher(name)
        if not before:
            before.append(previous)

    yield choose
    if before:
        launch.use_launcher(before[0])


def _jobs_of(item: pytest.Item) -> tuple[background.Maker, ...]:
    return getattr(getattr(item, "function", None), "background_jobs", ())


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The tests that own a background job (``tests/background.py``) run last, in their order, so that their jobs
    have had the whole session's idle cores."""
    items.sort(key=lambda item: bool(_jobs_of(item)))


def pytest_collection_finish(session: pytest.Session) -> None:
    """Queue the background jobs of the tests collected, in the order their tests run."""
    makes = [make for item in session.items for make in _jobs_of(item)]
    if makes:
        background.queue(makes)


def pytest_runtest_setup(item: pytest.Item) -> None:
    """Before each test, end a test pool that spins while no case runs (``tests.pool.watch_idle``)."""
    pool.watch_idle()


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """Name what ``tests.pool.watch_idle`` found spinning, if anything."""
    if pool.SPUN:
        terminalreporter.section("test pools ended for spinning while idle")
        for line in pool.SPUN:
            terminalreporter.write_line(line)
