"""Keeps a hook state to the buckets of one DDP model: a clear error when two models share it."""

from __future__ import annotations

import weakref

import torch

Identities = dict[int, "weakref.ref[torch.Tensor]"]
"""Parameters by identity: ``id(p)`` to a weak reference (a dead one's address reused is not taken for it)."""


class OneModel:
    """Watches the parameters of a hook state's iterations, and refuses a second DDP model's buckets.

    A state that keeps error buffers by bucket index (``OneBitState``, as PyTorch's
    ``PowerSGDState``) serves one DDP model. Registered on two (a GAN's generator and
    discriminator, an encoder and a decoder each under DDP), the second model's buckets
    would meet the first's error buffers under the same indices: compensated with another
    model's error, or sent uncompressed for good where the shapes differ, with nothing
    said. Every rank sees the same buckets in the same order, so every rank raises alike.

    1. ``check`` keeps each bucket's parameters by identity, with weak references (a
       model that is dropped is not kept alive).
    2. A bucket index seen twice in one iteration (an iteration ends at a bucket whose
       ``is_last()`` is True) means two models' buckets: ``ValueError``.
    3. So does a bucket that shares no parameter with the iteration before, when that
       iteration shared none with the one before it, and the bucket shares some with that
       one: iterations alternate between two sets of parameters. A new DDP over the same
       model (layers unfrozen or frozen) shares parameters with the iteration before, and
       a new model that replaces the old one never returns to the old one's parameters.
    """

    def __init__(self, owner: str) -> None:
        """``owner``: the state's class name, for the error."""
        self.owner = owner
        self._now: Identities = {}
        self._last: Identities = {}
        self._before: Identities = {}
        self._indices: set[int] = set()
        self._disjoint = False

    def check(self, index: int, params: list[torch.Tensor]) -> None:
        """Steps 1-3 for DDP bucket ``index`` holding ``params``."""
        if index in self._indices:
            raise ValueError(self._shared(f"bucket {index} came twice in one iteration"))
        if self._disjoint and not _shares(params, self._last) and _shares(params, self._before):
            raise ValueError(self._shared(f"bucket {index} holds parameters of the iteration before last and "
                                          f"none of the last one's"))
        self._indices.add(index)
        self._now.update((id(p), weakref.ref(p)) for p in params)

    def end_iteration(self) -> None:
        """Close the iteration: its parameters become the last one's."""
        self._disjoint = not _shares([ref() for ref in self._now.values()], self._last)
        self._before, self._last, self._now, self._indices = self._last, self._now, {}, set()

    def _shared(self, what: str) -> str:
        """The error's text: ``what`` was seen, so two models share the state, and what to do."""
        return (f"{self.owner}: {what}, so two DDP models share this state (a GAN's generator and discriminator?). "
                f"It keeps error buffers and a schedule per bucket of one model: give each DDP model its own "
                f"{self.owner}")


def _shares(params: list[torch.Tensor | None], identities: Identities) -> bool:
    """Whether any of ``params`` (None: a dead one) is one of ``identities`` (itself, not a tensor at its address)."""
    for p in params:
        ref = identities.get(id(p)) if p is not None else None
        if ref is not None and ref() is p:
            return True
    return False
