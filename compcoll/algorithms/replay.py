"""A plan's device parts recorded once and replayed without their Python (docs/architecture.md, "Replays")."""

from __future__ import annotations

import os
import threading
from collections import Counter, OrderedDict
from typing import Any, Callable

import torch

from .. import codecs
from ..kernels.launch import context_for, launcher
from ..recording import CALL_TENSORS, NO_CONTEXT, Recording, record
from ..workspace import current_stream

REPLAY_ENV = "COMPCOLL_REPLAY"
"""``0`` turns replays off (every call runs its Python); read at import, then ``enable``."""
KEPT = 16
"""Recordings a plan keeps (least recently used dropped first): one per bucket of a size, per stream."""
_ENABLED = [os.environ.get(REPLAY_ENV, "1") != "0"]
_UNSEEN = object()


def enabled() -> bool:
    """Whether plans replay their recorded device parts."""
    return _ENABLED[0]


def enable(on: bool) -> None:
    """Turn replays on or off for the process (``COMPCOLL_REPLAY=0`` sets off at import)."""
    _ENABLED[0] = bool(on)


class Replays:
    """One plan's recordings of its device parts, keyed by the tensors they are called on.

    A device part is a function of tensors that issues kernel launches, collectives and torch operators in place,
    and nothing else: it reads no host value, allocates nothing once warm, and keeps no host state (the plans'
    ``finish_*``); step 3 checks the first two where it can. ``run(name, part, *args)`` calls it:
    1. On the CPU, or with replays off: ``part(*args)``.
    2. Its key: ``name``, the launcher, the current stream, the thread, and every tensor argument's address, dtype,
       shape and strides (tuples of tensors flattened). The memory of everything else the steps touch (workspace
       buffers, the thread's kernel temporaries and device scalars, tables) the recording keeps alive; so the same
       key means the same launches on the same memory, and only the thread whose temporaries they are queues them.
       Arguments that are not tensors are not in the key: they are the plan's own settings (a scale's name, a block
       size); a host value that changes from call to call reaches the device part in a tensor (Birder's keys).
    3. The second and third calls with a key: ``part(*args)`` is recorded (``recording.record``) while it runs.
       The second recording is kept where both are the same launches (every argument's value: a host value that
       changes from call to call, a seed or a step, makes them differ), collectives and operators. One that saw
       anything else (``Recording.void``), or differs from the first, is kept as void, and such calls run their
       Python each time.
    4. A key recorded: its steps run again in order, each launch in its GPU's context, the collectives through the
       communicator's own issue (counted, ordered, timed as any), the operators on this call's tensors; returns the
       argument ``part`` returned.
    Launch counts are the same either way (``kernels.launch.COUNTS``).
    """

    def __init__(self) -> None:
        self._recorded: OrderedDict[tuple, tuple[Recording, int]] = OrderedDict()
        self._seen: OrderedDict[tuple, Recording | None] = OrderedDict()
        self.counts: Counter[str] = Counter()
        """Calls replayed, by part name (for tests and reports)."""

    @property
    def replayed(self) -> int:
        """Calls replayed, all parts together."""
        return sum(self.counts.values())

    def run(self, name: str, part: Callable[..., torch.Tensor], *args: Any) -> torch.Tensor:
        """``part(*args)``, replayed where it was recorded (see the class)."""
        tensors = [t for a in args for t in (a if isinstance(a, tuple) else (a,)) if isinstance(t, torch.Tensor)]
        first = tensors[0]
        if not enabled() or codecs.on_host(first):
            return part(*args)
        stream = current_stream(first.device.index) if first.is_cuda else first.device.type
        key = (name, launcher(), stream, threading.get_ident(),
               *((t.data_ptr(), t.dtype, t.shape, t.stride()) for t in tensors))
        found = self._recorded.get(key)
        if found is not None:
            recording, returned = found
            if recording.void is not None:
                return part(*args)
            self._recorded.move_to_end(key)
            _replay(recording, tensors)
            self.counts[name] += 1
            return args[returned]
        earlier = self._seen.get(key, _UNSEEN)
        if earlier is _UNSEEN:
            self._keep(self._seen, key, None)
            return part(*args)
        recording = Recording(tensors)
        result = record(recording, lambda: part(*args))
        returned = next((i for i, a in enumerate(args) if a is result), None)
        if returned is None:
            recording.refuse("a result that is not one of its arguments")
        if earlier is None:
            self._keep(self._seen, key, recording)
            return result
        del self._seen[key]
        if earlier.void is not None:
            recording.refuse(earlier.void)
        elif earlier.signature != recording.signature:
            recording.refuse("launches or collectives that differ from one call to the next")
        self._keep(self._recorded, key, (recording, returned))
        return result

    @staticmethod
    def _keep(table: OrderedDict, key: tuple, value: Any) -> None:
        table[key] = value
        table.move_to_end(key)
        if len(table) > KEPT:
            table.popitem(last=False)


def _replay(recording: Recording, tensors: list[torch.Tensor]) -> None:
    """Run ``recording``'s steps in order on this call's ``tensors``: consecutive launches of one GPU in its context,
    once; torch operators with their views of ``tensors``."""
    steps, i = recording.steps, 0
    while i < len(steps):
        fn, args, device = steps[i]
        if device is NO_CONTEXT or device is CALL_TENSORS:
            fn(*args) if device is NO_CONTEXT else fn(tensors, *args)
            i += 1
            continue
        with context_for(device):
            while i < len(steps) and steps[i][2] == device:
                fn, args, _ = steps[i]
                fn(*args)
                i += 1
