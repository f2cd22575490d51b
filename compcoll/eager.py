"""Calls that ``torch.compile`` leaves to Python: a graph break at them instead of a trace into compcoll's kernels."""

from __future__ import annotations

import functools
import importlib
import sys
from typing import Any, Callable, TypeVar

F = TypeVar("F", bound=Callable[..., Any])


def eager(fn: F) -> F:
    """``fn``, run as plain Python where ``torch.compile`` traces a caller of it.

    Dynamo cannot trace compcoll's kernels (Numba dispatchers) and collectives: tracing an
    optimizer's step failed deep inside numba. So:
    1. While ``torch._dynamo`` is not imported, no compile can be running: call ``fn``.
    2. Otherwise call it through ``torch._dynamo.disable(fn)`` (made once per function): a
       compiled caller breaks its graph there and calls ``fn`` eagerly, and
       ``torch.compile(fn)`` runs it as it is. The module is taken through the import system,
       which waits while another thread is still importing it (torch imports it lazily, at a
       thread's first dispatch mode: a replay's recording, ``recording.Guard``); read from
       ``sys.modules`` then, it lacked ``disable`` and the call failed.
    """
    disabled: list[Callable[..., Any]] = []

    @functools.wraps(fn)
    def call(*args: Any, **kwargs: Any) -> Any:
        if "torch._dynamo" not in sys.modules:
            return fn(*args, **kwargs)
        if not disabled:
            disabled.append(importlib.import_module("torch._dynamo").disable(fn))
        return disabled[0](*args, **kwargs)

    return call  # type: ignore[return-value]
