"""kernels.cpu.serial: the size below which CPU kernels run serially, set, read from the environment, or measured."""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Iterator

import numba
import numpy as np
import pytest

from compcoll.codecs import dispatch
from compcoll.kernels import cpu
from compcoll.kernels.cpu import serial


def test_the_switch_is_where_the_threads_save_their_wake() -> None:
    """``crossover``: wake / (per element * (1 - 1 / threads)), within [FLOOR, CEILING]; a noisy wake at or below
    zero gives the floor, one thread the ceiling."""
    assert serial.crossover(83e-6, 0.15e-9, 2) == 1106666
    assert serial.crossover(20e-6, 0.1e-9, 32) == 206451
    assert serial.crossover(1e-6, 1e-9, 2) == serial.FLOOR
    assert serial.crossover(-5e-6, 1e-9, 2) == serial.FLOOR
    assert serial.crossover(1.0, 1e-9, 2) == serial.CEILING
    assert serial.crossover(83e-6, 0.15e-9, 1) == serial.CEILING


@pytest.fixture
def undecided() -> Iterator[None]:
    """The switch not yet measured for the test; the process's own put back after it."""
    previous = cpu.use_serial_below(None)
    yield
    cpu.use_serial_below(previous)


def test_the_switch_is_measured_once_where_an_input_reaches_the_floor(undecided: None) -> None:
    """Below ``FLOOR`` an input runs serially without a measure; the first at the floor measures the switch, between
    the floor and the ceiling, and it is kept; on one thread it is the ceiling."""
    assert cpu.serially(cpu.FLOOR - 1)
    assert cpu.use_serial_below(None) is None
    with dispatch._CPU_KERNELS:
        cpu.serially(cpu.FLOOR)
        found = cpu.serial_below()
        assert serial.FLOOR <= found <= serial.CEILING and cpu.serial_below() == found
        threads = numba.get_num_threads()
        numba.set_num_threads(1)
        try:
            assert serial.measured() == serial.CEILING
        finally:
            numba.set_num_threads(threads)


def test_a_switch_set_holds_on_both_sides_of_it(undecided: None) -> None:
    """``use_serial_below(k)``: inputs below k run serially, from k threaded, at any k (0: every input threaded);
    what is not a count of elements is refused."""
    cases = ((0, (0, 1, cpu.FLOOR - 1), [False] * 3), (10, (0, 9, 10, 11), [True, True, False, False]),
             (cpu.FLOOR + 3, (cpu.FLOOR, cpu.FLOOR + 2, cpu.FLOOR + 3), [True, True, False]))
    for k, sizes, serially in cases:
        cpu.use_serial_below(k)
        assert [cpu.serially(n) for n in sizes] == serially
    for bad in (-1, 1.5, True, "10"):
        with pytest.raises(ValueError, match="serial switch must be a number of elements"):
            cpu.use_serial_below(bad)


def test_a_calls_work_counts_the_rows_it_adds_up_and_block_scales_keep_the_floor(undecided: None) -> None:
    """``runs_serially``: an accumulate of 4 rows into 249 elements is 996 elements' work (serial below a switch of
    1000), into 250 is 1000 (threaded); another kernel weighs its tensor's elements alone; the block scales' coding
    runs serially below the switch where it is below ``FLOOR``, else below ``FLOOR`` scales."""
    rows = np.zeros((4, 10), np.uint8)
    cpu.use_serial_below(1000)
    assert [cpu.runs_serially("accumulate_signs", n, (rows,)) for n in (249, 250)] == [True, False]
    assert [cpu.runs_serially("compensated_power_sum", n, (rows,)) for n in (999, 1000)] == [True, False]
    assert [cpu.runs_serially("code_blocks", n, (rows,)) for n in (999, 1000)] == [True, False]
    cpu.use_serial_below(1 << 20)
    assert [cpu.runs_serially("code_blocks", n, (rows,)) for n in (cpu.FLOOR - 1, cpu.FLOOR)] == [True, False]
    assert [cpu.runs_serially("compensated_power_sum", n, (rows,)) for n in (cpu.FLOOR, (1 << 20) - 1)] == [True] * 2


@pytest.mark.parametrize("text", ["many", "-1", "1.5", ""])
def test_a_bad_environment_value_is_refused_naming_the_variable(text: str) -> None:
    with pytest.raises(ValueError, match=f"COMPCOLL_SERIAL_BELOW={text!r}: give a number of elements"):
        serial.from_environment(text)


def test_the_environment_sets_the_switch_at_import_and_a_bad_value_fails_the_import() -> None:
    """``COMPCOLL_SERIAL_BELOW`` read at import: 12345 is the switch; "many" fails ``import compcoll``, naming it."""
    script = "import compcoll.kernels.cpu as c; print(c.serial_below(), c.serially(12344), c.serially(12345))"
    runs = [subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120,
                           env={**os.environ, serial.SERIAL_BELOW_ENV: value}) for value in ("12345", "many")]
    assert runs[0].returncode == 0 and runs[0].stdout.split() == ["12345", "True", "False"], runs[0].stderr
    assert runs[1].returncode != 0 and "COMPCOLL_SERIAL_BELOW='many': give a number of elements" in runs[1].stderr
