"""Choices made of named values that ranks must hold alike, and which name differs on which ranks when they do not."""

from __future__ import annotations

import json
import numbers
import zlib
from functools import partial
from typing import Any

from ..comm import Communicator
from .agreement import Option
from .rounds import gather_texts

ABSENT = "absent"
"""How a message shows a name that a rank's values lack."""


def values_option(name: str, values: dict[str, Any]) -> Option:
    """An ``Option`` over named plain values (numbers, strings, booleans, None, and lists of them).

    1. Its code is a CRC-32 of the values as JSON with sorted names, so ranks that hold
       equal values give equal codes whatever order they named them in.
    2. Where the codes differ, every rank's agreement round explains the option with
       ``difference``: a collective every rank reaches together, as they all read the
       same table of codes.
    """
    return Option(name, zlib.crc32(json.dumps(values, sort_keys=True, default=_number).encode()),
                  explain=partial(difference, values=values))


def _number(value: Any) -> int | float:
    """A value JSON does not write itself, as JSON may: a numpy integer or float (``numbers.Integral``, ``Real``);
    anything else raises TypeError, as ``json.dumps`` does."""
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, numbers.Real):
        return float(value)
    raise TypeError(f"a setting must be a number, string, boolean, None or a list of them, got {value!r}")


def difference(comm: Communicator, values: dict[str, Any]) -> str:
    """The first name whose values differ across ranks, and which ranks hold which value.

    1. Gather every rank's ``values`` as JSON, whole (``rounds.gather_texts``).
    2. Walk the names in rank 0's order, then any that only other ranks hold.
    3. For the first name whose values are not all equal, say each value (as Python
       writes it, or ``ABSENT``) with the ranks that hold it, in order of the lowest such
       rank.
    Every rank reads the same texts, so every rank returns the same message.
    """
    rows = [json.loads(row) for row in gather_texts(comm, json.dumps(values, default=_number))]
    for key in dict.fromkeys(key for row in rows for key in row):
        held = [repr(row[key]) if key in row else ABSENT for row in rows]
        if len(set(held)) > 1:
            ranks: dict[str, list[int]] = {}
            for rank, value in enumerate(held):
                ranks.setdefault(value, []).append(rank)
            return f"{key}: " + ", ".join(f"{value} on rank(s) {ranks_text(on)}" for value, on in ranks.items())
    return "their values differ"


def ranks_text(ranks: list[int]) -> str:
    """Ascending ranks as a list with runs of three or more shortened: ``[0-2, 5, 7-1023]``."""
    runs: list[list[int]] = []
    for rank in ranks:
        if runs and rank == runs[-1][-1] + 1:
            runs[-1].append(rank)
        else:
            runs.append([rank])
    return "[" + ", ".join(f"{run[0]}-{run[-1]}" if len(run) > 2 else ", ".join(map(str, run)) for run in runs) + "]"
