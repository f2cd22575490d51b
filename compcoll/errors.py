"""Exceptions raised by compcoll's collectives."""

from __future__ import annotations


class CompcollError(RuntimeError):
    """Base class of compcoll's own errors."""


class CollectiveTimeout(CompcollError, TimeoutError):
    """A collective did not complete in time; its communicator is no longer usable.

    ``absent`` lists the ranks whose part never arrived, where the transport can tell
    (the small all-gathers every call starts with); empty otherwise.
    """

    def __init__(self, message: str, absent: list[int] | None = None) -> None:
        super().__init__(message)
        self.absent = list(absent or ())


class CommunicatorBroken(CompcollError):
    """A communicator was used after one of its collectives timed out or failed."""


class RankMismatchError(CompcollError, ValueError):
    """Ranks called a collective with inputs that do not agree (sizes, shapes, options)."""


class NonFiniteError(CompcollError, FloatingPointError):
    """An input holds NaN or Inf on some rank; raised on every rank, nothing was updated."""


class RemoteError(CompcollError):
    """Another rank refused its part of a collective (its own arguments were bad); raised on the other ranks.

    Nothing was changed on any rank and the communicator is still usable. ``failures``
    maps each refusing rank to its error's message.
    """

    def __init__(self, message: str, failures: dict[int, str]) -> None:
        super().__init__(message)
        self.failures = failures
