"""The fixed-size host rounds every rank meets in, and a refused call's part in them (docs/architecture.md).

The records' all-gather, a summed round's allreduce and values' all-gather, the refusing ranks' messages ("Plans").
"""

from __future__ import annotations

from functools import partial
from typing import Callable, NoReturn, TypeVar

import torch

from .. import spec
from ..comm import Communicator
from ..errors import RemoteError

RECORD = spec.AGREEMENT_FIELDS
SUMMED = spec.SUMMED_AGREEMENT_FIELDS
REFUSED = -1.0
"""The signature of a rank that refuses its call (signatures are CRC-32s, never negative)."""
MESSAGE_BYTES = 240
"""Bytes of each refusing rank's error message that reach the other ranks."""
T = TypeVar("T")


def summed(comm: Communicator) -> bool:
    """Whether ``comm``'s agreement rounds are allreduces (more than ``spec.GATHERED_AGREEMENT_RANKS`` ranks)."""
    return spec.summed_agreement(comm.size)


def sum_fields(comm: Communicator, signature: float, finite: bool) -> list[float]:
    """A summed round's first collective: the allreduce of the signature's bytes, their squares, refused? and not
    finite? (``SUMMED``); the sums.

    Every rank reads the same sums (small integers, exact in float64 in any order), so every
    rank takes the same branch.
    """
    record = torch.tensor(spec.summed_fields(signature, finite), dtype=torch.float64)
    comm.allreduce(record)
    return record.tolist()


def gather_value(comm: Communicator, value: float, buffers: tuple[torch.Tensor, torch.Tensor] | None = None
                 ) -> torch.Tensor:
    """A summed round's second collective: the all-gather of one float64 a rank (its ``value``), through
    ``buffers`` (this rank's and the table: host float64 tensors an ``Agreement`` keeps) or new ones; the table.

    A call that agrees on a value makes it right after the allreduce, before it reads the sums; every other rank
    makes it once it reads that the round failed (a refusing rank always), so that all ranks of a failed round
    meet in it and then in the statuses' all-gather.
    """
    mine, table = buffers or (torch.empty(1, dtype=torch.float64), torch.empty(comm.size, dtype=torch.float64))
    mine.numpy()[0] = value
    comm.allgather(mine, table)
    return table


def fields_fine(sums: list[float], n: int) -> bool:
    """Whether a summed round's ``SUMMED`` sums over ``n`` ranks say all is well: every byte b of the signatures
    with n * sum(b^2) == sum(b)^2 (all equal), and no rank refused or not finite."""
    return all(n * sums[4 + i] == sums[i] * sums[i] for i in range(4)) and sums[8] == 0 and sums[9] == 0


def gather_statuses(comm: Communicator, signature: float, finite: bool, value: float,
                    buffers: tuple[torch.Tensor, torch.Tensor] | None = None) -> list[list[float]]:
    """Every rank's (signature or ``REFUSED``, finite?, value): an all-gather of ``RECORD`` float64s, through
    ``buffers`` (this rank's record and the table: host float64 tensors an ``Agreement`` keeps) or new ones. The
    host writes and reads them through numpy (a torch operator on a CPU tensor costs a few microseconds more)."""
    mine, table = buffers or (torch.empty(RECORD, dtype=torch.float64),
                              torch.empty(comm.size * RECORD, dtype=torch.float64))
    mine.numpy()[:] = (signature, float(finite), value)
    comm.allgather(mine, table)
    return table.numpy().reshape(comm.size, RECORD).tolist()


def refusing_ranks(table: list[list[float]]) -> list[int]:
    """The ranks whose row in a status table says they refused their call."""
    return [r for r, row in enumerate(table) if row[0] == REFUSED]


def gather_messages(comm: Communicator, mine: str, refusing: list[int]) -> dict[int, str]:
    """Every refusing rank's message, by rank: a fixed-size allgather of ``MESSAGE_BYTES`` per rank (UTF-8, cut)."""
    data = mine.encode()[:MESSAGE_BYTES].ljust(MESSAGE_BYTES, b"\0")
    table = torch.empty(comm.size * MESSAGE_BYTES, dtype=torch.uint8)
    comm.allgather(torch.frombuffer(bytearray(data), dtype=torch.uint8), table)
    rows = table.view(comm.size, MESSAGE_BYTES)
    return {r: bytes(rows[r].tolist()).rstrip(b"\0").decode(errors="replace") for r in refusing}


def gather_texts(comm: Communicator, mine: str) -> list[str]:
    """Every rank's ``mine``, by rank, whole: an all-gather of each text's length, then one of every text padded to
    the longest (two collectives every rank makes, whatever its text)."""
    data = mine.encode()
    lengths = torch.empty(comm.size, dtype=torch.int64)
    comm.allgather(torch.tensor([len(data)], dtype=torch.int64), lengths)
    width = max(1, int(lengths.max()))
    table = torch.empty(comm.size * width, dtype=torch.uint8)
    comm.allgather(torch.frombuffer(bytearray(data.ljust(width, b"\0")), dtype=torch.uint8), table)
    rows = table.view(comm.size, width)
    return [bytes(rows[r, :int(lengths[r])].tolist()).decode(errors="replace") for r in range(comm.size)]


def refuse(comm: Communicator, error: Exception) -> NoReturn:
    """Take this rank's part in a call whose own arguments failed their checks, then raise ``error``.

    1. Take part in the peers' agreement round with signature ``REFUSED``: the status
       all-gather (where the round is summed, after its allreduce, which says a rank refused,
       and the values' all-gather that every rank of a failed summed round makes), so the
       rounds pair up and every rank sees the refusal.
    2. All-gather the error's message (``gather_messages``); every other rank raises
       ``RemoteError`` with it, and ranks that refused too raise their own errors.
    3. Raise ``error``. Nothing was changed on any rank; the communicator is still usable.
    Must run in this rank's turn (``checked``).
    """
    if summed(comm):
        sum_fields(comm, REFUSED, True)
        gather_value(comm, 0.0)
    gather_messages(comm, f"{type(error).__name__}: {error}", refusing_ranks(gather_statuses(comm, REFUSED, True, 0.0)))
    raise error


def agree_outcome(comm: Communicator, what: str, error: Exception | None) -> None:
    """Every rank learns whether some rank's local part of ``what`` failed; all raise if one did.

    1. Allgather one flag per rank (failed or not).
    2. If any rank failed, allgather the failing ranks' messages (``gather_messages``): a failing
       rank raises its own ``error``, every other rank ``RemoteError`` naming them.
    Every rank must call it at the same point (a collective), failed or not.
    """
    flag = torch.tensor([0.0 if error is None else 1.0], dtype=torch.float64)
    table = torch.empty(comm.size, dtype=torch.float64)
    comm.allgather(flag, table)
    failing = [r for r, value in enumerate(table.tolist()) if value]
    if not failing:
        return
    messages = gather_messages(comm, "" if error is None else f"{type(error).__name__}: {error}", failing)
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
        return comm.run(partial(refuse, comm, exc), what)
