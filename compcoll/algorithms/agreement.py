"""One small fixed-size allgather per call, so that every rank refuses a bad call alike (docs/architecture.md, "Plans")."""

from __future__ import annotations

import zlib
from dataclasses import dataclass
from typing import Callable, NoReturn, Sequence, TypeVar

import torch

from ..comm import Communicator
from ..errors import NonFiniteError, RankMismatchError, RemoteError
from ..spec import AGREEMENT_FIELDS

RECORD = AGREEMENT_FIELDS
MAX_OPTIONS = 6
REFUSED = -1.0
"""The signature of a rank that refuses its call (signatures are CRC-32s, never negative)."""
MESSAGE_BYTES = 240
"""Bytes of each refusing rank's error message that reach the other ranks."""
T = TypeVar("T")
_DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64)


@dataclass(frozen=True)
class Option:
    """A choice all ranks must make alike: its plural name, this rank's code, and labels."""

    name: str
    code: int
    labels: tuple[str, ...] = ()

    def label(self, code: float) -> str:
        return self.labels[int(code)] if self.labels and 0 <= int(code) < len(self.labels) else str(int(code))


def _crc(text: str) -> int:
    return zlib.crc32(text.encode())


class Agreement:
    """The per-call check of one plan: every rank's (signature, finite?, value), gathered.

    The plan's description (collective, numel, shape, dtype, options) is reduced once to a
    32-bit signature; each call then sends only that, its finiteness and one value (a
    scale), always in ``RECORD`` float64s, whatever the collective, so that ranks that are
    in different calls still meet in a round of the same size and all raise.
    1. Allgather the records.
    2. Some rank refused its call (``refuse``: its own arguments were bad): a second,
       fixed-size allgather of the refusing ranks' messages, and ``RemoteError`` naming
       them on every other rank.
    3. Signatures differ: a second, fixed-size allgather of the descriptions, and the same
       ``RankMismatchError`` on every rank naming what differs (size, shape, dtype, an
       option, or the collective itself).
    4. Some rank not finite: ``NonFiniteError`` on every rank.

    Args:
        comm: the communicator the call runs on.
        what: the collective's name, for messages (and part of the signature).
        numel, shape, dtype: the tensor every rank passes.
        options: choices that must agree across ranks (at most ``MAX_OPTIONS``).
    """

    def __init__(
        self, comm: Communicator, what: str, numel: int, shape: Sequence[int], dtype: torch.dtype,
        options: tuple[Option, ...] = (),
    ) -> None:
        if len(options) > MAX_OPTIONS:
            raise ValueError(f"{what}: at most {MAX_OPTIONS} agreed options, got {len(options)}")
        self.comm = comm
        self.what = what
        self.options = options
        dtype_code = _DTYPES.index(dtype) if dtype in _DTYPES else _crc(str(dtype))
        codes = [float(o.code) for o in options] + [0.0] * (MAX_OPTIONS - len(options))
        self.description = [float(_crc(what)), float(numel), float(_crc(repr(tuple(shape)))), float(dtype_code)] + codes
        self.signature = float(_crc(repr(self.description)))
        self._mine = torch.empty(RECORD, dtype=torch.float64)
        self._table = torch.empty(comm.size * RECORD, dtype=torch.float64)
        self._mine_fields = self._mine.numpy()
        self._rows = self._table.numpy().reshape(comm.size, RECORD)
        self._values = self._table.view(comm.size, RECORD)[:, 2]

    def check(self, finite: bool | None = None, value: float = 0.0) -> torch.Tensor:
        """Steps 1-4 for this call; returns every rank's ``value`` (float64, by rank).

        ``finite=None`` skips the finiteness check. The returned tensor is reused by the
        next call: read it before.
        """
        mine = self._mine_fields
        mine[0], mine[1], mine[2] = self.signature, 1.0 if finite is None else float(finite), value
        self.comm.allgather(self._mine, self._table)
        table = self._rows.tolist()
        if any(row[0] != self.signature for row in table):
            refusing = _refused(table)
            if refusing:
                failures = _messages(self.comm, "", refusing)
                listing = "; ".join(f"rank {r}: {message}" for r, message in failures.items())
                raise RemoteError(
                    f"{self.what}: rank(s) {list(failures)} refused the call ({listing}); nothing was changed on "
                    f"any rank and the communicator is still usable", failures)
            self._diagnose()
        bad = [r for r, row in enumerate(table) if not row[1]]
        if bad:
            raise NonFiniteError(
                f"{self.what}: NaN or Inf in the input on rank(s) {bad}; no buffer was changed on any rank "
                f"and the communicator is still usable (skip this step, as a loss scaler does, or fix "
                f"the input)"
            )
        return self._values

    def _diagnose(self) -> None:
        """Gather every rank's description and raise the same RankMismatchError on every rank."""
        mine = torch.tensor(self.description, dtype=torch.float64)
        table = torch.empty(self.comm.size * mine.numel(), dtype=torch.float64)
        self.comm.allgather(mine, table)
        rows = table.view(self.comm.size, -1).tolist()

        def listing(column: int, label=lambda v: str(int(v))) -> str:
            return ", ".join(f"rank {r}: {label(row[column])}" for r, row in enumerate(rows))

        def differs(column: int) -> bool:
            return any(row[column] != rows[0][column] for row in rows)

        what = self.what
        if differs(0):
            raise RankMismatchError(
                f"{what}: the ranks are in different collectives (this rank is in {what}); calls are out of "
                f"step across ranks"
            )
        if differs(1):
            raise RankMismatchError(f"{what}: tensor sizes differ across ranks ({listing(1)} elements)")
        if differs(2):
            raise RankMismatchError(
                f"{what}: tensor shapes differ across ranks (same number of elements); reshape them alike"
            )
        if differs(3):
            names = {float(i): str(d).replace("torch.", "") for i, d in enumerate(_DTYPES)}
            raise RankMismatchError(
                f"{what}: tensor dtypes differ across ranks ({listing(3, lambda v: names.get(v, '?'))})"
            )
        for column, option in enumerate(self.options, 4):
            if differs(column):
                raise RankMismatchError(
                    f"{what}: ranks asked for different {option.name} ({listing(column, option.label)})"
                )
        raise RankMismatchError(f"{what}: the ranks' calls differ (signatures differ)")


def agree(
    comm: Communicator,
    what: str,
    tensor: torch.Tensor,
    finite: bool | None,
    options: tuple[Option, ...] = (),
    values: tuple[float, ...] = (),
) -> torch.Tensor:
    """A one-off ``Agreement`` for ``tensor`` (a call that keeps no plan: an optimizer's construction or step).

    Returns the (size, len(values)) table of every rank's ``values`` (at most one value).
    """
    if len(values) > 1:
        raise ValueError(f"{what}: at most one agreed value per call, got {len(values)}")
    agreement = Agreement(comm, what, tensor.numel(), tensor.shape, tensor.dtype, options)
    gathered = agreement.check(finite, values[0] if values else 0.0).clone()
    return gathered.view(-1, 1)[:, :len(values)]


def _refused(table: list[list[float]]) -> list[int]:
    """The ranks whose record in an agreement table says they refused their call."""
    return [r for r, row in enumerate(table) if row[0] == REFUSED]


def _messages(comm: Communicator, mine: str, refusing: list[int]) -> dict[int, str]:
    """Every refusing rank's message, by rank: a fixed-size allgather of ``MESSAGE_BYTES`` per rank (UTF-8, cut)."""
    data = mine.encode()[:MESSAGE_BYTES].ljust(MESSAGE_BYTES, b"\0")
    table = torch.empty(comm.size * MESSAGE_BYTES, dtype=torch.uint8)
    comm.allgather(torch.frombuffer(bytearray(data), dtype=torch.uint8), table)
    rows = table.view(comm.size, MESSAGE_BYTES)
    return {r: bytes(rows[r].tolist()).rstrip(b"\0").decode(errors="replace") for r in refusing}


def refuse(comm: Communicator, error: Exception) -> NoReturn:
    """Take this rank's part in a call whose own arguments failed their checks, then raise ``error``.

    1. Allgather a record of the agreement's size whose signature is ``REFUSED``: the
       other ranks are in their call's agreement round, so the rounds pair up.
    2. Allgather the error's message (``_messages``); every other rank raises
       ``RemoteError`` with it, and ranks that refused too raise their own errors.
    3. Raise ``error``. Nothing was changed on any rank; the communicator is still usable.
    Must run in this rank's turn (``checked``).
    """
    mine = torch.tensor([REFUSED, 1.0, 0.0], dtype=torch.float64)
    table = torch.empty(comm.size * RECORD, dtype=torch.float64)
    comm.allgather(mine, table)
    _messages(comm, f"{type(error).__name__}: {error}", _refused(table.view(comm.size, RECORD).tolist()))
    raise error


def agree_outcome(comm: Communicator, what: str, error: Exception | None) -> None:
    """Every rank learns whether some rank's local part of ``what`` failed; all raise if one did.

    1. Allgather one flag per rank (failed or not).
    2. If any rank failed, allgather the failing ranks' messages (``_messages``): a failing
       rank raises its own ``error``, every other rank ``RemoteError`` naming them.
    Every rank must call it at the same point (a collective), failed or not.
    """
    flag = torch.tensor([0.0 if error is None else 1.0], dtype=torch.float64)
    table = torch.empty(comm.size, dtype=torch.float64)
    comm.allgather(flag, table)
    failing = [r for r, value in enumerate(table.tolist()) if value]
    if not failing:
        return
    messages = _messages(comm, "" if error is None else f"{type(error).__name__}: {error}", failing)
    if error is not None:
        raise error
    raise RemoteError(f"{what} failed on rank(s) {failing}: " + "; ".join(f"rank {r}: {m}" for r, m in
                                                                         messages.items()), messages)


def checked(comm: Communicator, what: str, checks: Callable[[], T]) -> T:
    """Run a call's local ``checks``; if they raise TypeError or ValueError, ``refuse`` the call in this rank's turn.

    So a rank with bad arguments still meets its peers' agreement round, and every rank
    raises at once instead of waiting for a timeout (docs/architecture.md, "Plans"). The
    refusal runs blocking, also for an asynchronous call: the error is raised by the call.
    """
    try:
        return checks()
    except (TypeError, ValueError) as exc:
        return comm.run(lambda: refuse(comm, exc), what)
