"""The thread's recording of device work: what kernel launches and collectives report while a call's device part is
recorded for replay (``algorithms.replay``; docs/architecture.md, "Replays")."""

from __future__ import annotations

import threading
from typing import Any, Callable

import torch
from torch.utils._python_dispatch import TorchDispatchMode

Step = tuple[Callable[..., Any], tuple, Any]
"""One recorded step: a function, its arguments, and the GPU whose context its launch needs (``NO_CONTEXT``: none, a
collective or a counted launch of meta tensors)."""
NO_CONTEXT = None
_UNISSUED = {torch.ops.aten.detach.default, torch.ops.aten.lift_fresh.default, torch.ops.aten.alias.default}
"""Operators that issue no work, besides views."""


class Recording:
    """The device work one run of a call's device part issued, in order, or why it cannot be replayed.

    A replay runs ``steps`` again and nothing else, so the recording is void where the run did anything else:
    a torch operator that computes or allocates (``Guard``), a value read to the host, or an asynchronous collective.

    Args:
        keyed: the (first, last) byte addresses of the call's own tensors (the replay's key): a launch argument in
            them is not kept alive by the recording, whose next call brings those tensors itself.
    """

    def __init__(self, keyed: tuple[tuple[int, int], ...]) -> None:
        self.steps: list[Step] = []
        self.signature: list[tuple] = []
        """What each step did, comparable between two recordings: its kernel, grid and every argument's value
        (a view's address, shape, strides and dtype), or its collective."""
        self.keep: list[Any] = []
        self.void: str | None = None
        self.keyed = keyed
        self._quiet = 0

    def keyed_memory(self, address: int) -> bool:
        """Whether ``address`` lies in one of the call's own tensors."""
        return any(first <= address < last for first, last in self.keyed)

    def launch(self, step: Step, signature: tuple, owners: list[Any]) -> None:
        """Add a kernel launch and its ``signature``; keep ``owners`` (the tensors whose memory its arguments point
        into) alive."""
        self.steps.append(step)
        self.signature.append(signature)
        self.keep.extend(owners)

    def collective(self, issue: Callable[..., Any], *args: Any) -> Any:
        """Run a transport operation (``issue(*args)``, the last argument its ``async_op``) and add it: the torch
        operators it runs (a transport's own copies) are its part and are replayed by running it again."""
        if args[-1]:
            self.refuse("an asynchronous collective")
        self._quiet += 1
        try:
            done = issue(*args)
        finally:
            self._quiet -= 1
        self.steps.append((issue, args, NO_CONTEXT))
        self.signature.append((issue, args[0]))
        return done

    def refuse(self, why: str) -> None:
        """Make the recording void (the first reason is kept)."""
        if self.void is None:
            self.void = why

    @property
    def quiet(self) -> bool:
        """Whether a collective is running (its torch operators are its own)."""
        return self._quiet > 0


class Guard(TorchDispatchMode):
    """Voids ``recording`` at a torch operator that computes or allocates outside a collective: work a replay of
    its steps would not do."""

    def __init__(self, recording: Recording) -> None:
        super().__init__()
        self.recording = recording

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if not (self.recording.quiet or func.is_view or func in _UNISSUED):
            self.recording.refuse(f"the torch operator {func}")
        return func(*args, **(kwargs or {}))


_THREAD = threading.local()


def current() -> Recording | None:
    """The recording this thread is making, or None (the launch path asks at every launch)."""
    return getattr(_THREAD, "recording", None)


def record(recording: Recording, run: Callable[[], Any]) -> Any:
    """Run ``run()`` with ``recording`` as this thread's, under its ``Guard``; returns what ``run`` returns."""
    _THREAD.recording = recording
    try:
        with Guard(recording):
            return run()
    finally:
        _THREAD.recording = None
