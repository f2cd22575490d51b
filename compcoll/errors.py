"""Exceptions raised by compcoll's collectives."""

from __future__ import annotations


class CompcollError(RuntimeError):
    """Base class of compcoll's own errors."""


class CollectiveTimeout(CompcollError, TimeoutError):
    """A collective did not complete in time; its communicator is no longer usable."""


class CommunicatorBroken(CompcollError):
    """A communicator was used after one of its collectives timed out or failed."""


class RankMismatchError(CompcollError, ValueError):
    """Ranks called a collective with inputs that do not agree (sizes, shapes, options)."""


class NonFiniteError(CompcollError, FloatingPointError):
    """An input holds NaN or Inf on some rank; raised on every rank, nothing was updated."""
