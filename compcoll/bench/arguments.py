"""The benchmark CLIs' argument types: sizes, counts, numbers and lists, each refusing what would make no sense."""

from __future__ import annotations

import argparse
from typing import Callable, TypeVar

T = TypeVar("T")
_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
_SCALES = {"K": 1e3, "M": 1e6, "B": 1e9}


def parse_size(text: str) -> int:
    """'64K', '16M', '1G' or a plain number of bytes."""
    text = text.strip().upper().removesuffix("B")
    unit = text[-1] if text and text[-1] in _UNITS else ""
    return int(float(text[: len(text) - len(unit)]) * _UNITS[unit])


def parse_count(text: str) -> int:
    """'300M', '1.3B', '7B' parameters -> a count."""
    text = text.strip().upper()
    scale = _SCALES.get(text[-1], 1)
    return int(float(text.rstrip("".join(_SCALES))) * scale)


def at_least(least: float, parse: Callable[[str], T] = int, what: str = "integer") -> Callable[[str], T]:
    """An argparse type: ``parse(text)`` where it is at least ``least``, else argparse's error naming the option.

    1. Parse the text (a ValueError becomes argparse's "invalid ``what`` value").
    2. Refuse a value below ``least`` (or NaN) with ``ArgumentTypeError``, which argparse
       prints after the option's name before it exits with status 2.
    """
    def checked(text: str) -> T:
        value = parse(text)
        if not value >= least:
            raise argparse.ArgumentTypeError(f"must be at least {least:g}, got {text!r}")
        return value

    checked.__name__ = what
    return checked


def above(least: float) -> Callable[[str], float]:
    """An argparse type: a float strictly above ``least``."""
    def checked(text: str) -> float:
        value = float(text)
        if not value > least:
            raise argparse.ArgumentTypeError(f"must be above {least:g}, got {text!r}")
        return value

    checked.__name__ = "number"
    return checked


def listed(item: Callable[[str], T]) -> Callable[[str], list[T]]:
    """An argparse type: comma-separated values, each through ``item`` (an ``at_least`` or ``above`` type)."""
    def parse(text: str) -> list[T]:
        return [item(value) for value in text.split(",")]

    parse.__name__ = getattr(item, "__name__", "value") + " list"
    return parse
