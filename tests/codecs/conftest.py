"""The codecs' tests switch from the serial twins to the threaded kernels at ``cpu.FLOOR``, whatever the machine."""

from __future__ import annotations

from typing import Iterator

import pytest

from compcoll.kernels import cpu


@pytest.fixture(autouse=True)
def switch_at_the_floor() -> Iterator[None]:
    """The serial switch at ``cpu.FLOOR`` for the test (``drawn.vectors`` draws lengths on both sides of it), put
    back after it: on this machine it is measured, so the lengths past it would run serially too."""
    previous = cpu.use_serial_below(cpu.FLOOR)
    yield
    cpu.use_serial_below(previous)
