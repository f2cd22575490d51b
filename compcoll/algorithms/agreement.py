"""One small allgather of per-call metadata, so that every rank refuses a bad call alike."""

from __future__ import annotations

import zlib
from dataclasses import dataclass

import torch

from ..comm import Communicator
from ..errors import NonFiniteError, RankMismatchError

COMMON_FIELDS = 3
_NUMEL, _SHAPE, _FINITE = range(COMMON_FIELDS)


@dataclass(frozen=True)
class Option:
    """A per-call choice all ranks must make alike: its plural name, this rank's code, and labels."""

    name: str
    code: int
    labels: tuple[str, ...] = ()

    def label(self, code: float) -> str:
        return self.labels[int(code)] if self.labels else str(int(code))


def fields(options: int, values: int) -> int:
    """Metadata fields (float64) each rank sends for ``options`` options and ``values`` values."""
    return COMMON_FIELDS + options + values


def agree(
    comm: Communicator,
    what: str,
    tensor: torch.Tensor,
    finite: bool | None,
    options: tuple[Option, ...] = (),
    values: tuple[float, ...] = (),
) -> torch.Tensor:
    """Allgather (numel, shape, finite?, options, values) and check them on every rank.

    1. Every rank sends ``fields(len(options), len(values))`` float64s.
    2. Every rank checks the gathered table in the same order: sizes, shapes, each option,
       then finiteness, so all ranks raise the same error or none does.

    Args:
        comm: the communicator of the call.
        what: the calling function's name, for messages.
        tensor: this rank's input (its numel and shape must agree across ranks).
        finite: whether this rank's input is finite; None skips the check.
        options: choices that must agree across ranks.
        values: numbers that may differ across ranks (scales, flags).

    Returns:
        The (size, len(values)) table of every rank's ``values``.

    Raises:
        RankMismatchError: sizes, shapes or options differ across ranks.
        NonFiniteError: some rank reported a non-finite input.
    """
    mine = torch.tensor(
        [tensor.numel(), _shape_code(tensor), 1.0 if finite is None else float(finite)]
        + [float(o.code) for o in options]
        + [float(v) for v in values],
        dtype=torch.float64,
    )
    table = torch.empty(comm.size * mine.numel(), dtype=torch.float64).view(comm.size, mine.numel())
    comm.allgather(mine, table.view(-1))
    _check(table, what, options)
    return table[:, COMMON_FIELDS + len(options):]


def _shape_code(tensor: torch.Tensor) -> int:
    return zlib.crc32(repr(tuple(tensor.shape)).encode())


def _check(table: torch.Tensor, what: str, options: tuple[Option, ...]) -> None:
    """Raise the same error on every rank when the gathered metadata disagree or is not finite.

    The table is read once into Python numbers (a few per rank: cheaper than torch ops).
    """
    rows = table.tolist()

    def column_of(column: int) -> list[float]:
        return [row[column] for row in rows]

    def differing(column: int) -> bool:
        return any(row[column] != rows[0][column] for row in rows)

    if differing(_NUMEL):
        sizes = ", ".join(f"rank {r}: {int(v)}" for r, v in enumerate(column_of(_NUMEL)))
        raise RankMismatchError(f"{what}: tensor sizes differ across ranks ({sizes} elements)")
    if differing(_SHAPE):
        raise RankMismatchError(
            f"{what}: tensor shapes differ across ranks (same number of elements); reshape them alike"
        )
    for column, option in enumerate(options, COMMON_FIELDS):
        if differing(column):
            chosen = ", ".join(f"rank {r}: {option.label(v)}" for r, v in enumerate(column_of(column)))
            raise RankMismatchError(f"{what}: ranks asked for different {option.name} ({chosen})")
    bad = [r for r, ok in enumerate(column_of(_FINITE)) if not ok]
    if bad:
        raise NonFiniteError(
            f"{what}: NaN or Inf in the input on rank(s) {bad}; no buffer was changed on any rank "
            f"and the communicator is still usable (skip this step, as a loss scaler does, or fix "
            f"the input)"
        )
