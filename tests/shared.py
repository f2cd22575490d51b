"""A pure function of the whole world (the numpy reference) computed once per in-process world, shared by its ranks."""

from __future__ import annotations

import hashlib
import threading
import weakref
from typing import Any, Callable

import numpy as np
import torch

from compcoll.comm.local import LocalComm

_LOCK = threading.Lock()
_ENTRIES: weakref.WeakKeyDictionary[object, dict[bytes, "_Entry"]] = weakref.WeakKeyDictionary()
_JOINED = threading.local()


class ThreadWorld:
    """A world of ``size`` thread ranks that is not a ``LocalComm``'s (torch's threaded process group,
    ``tests/ddp/threaded_group.py``): each rank's thread calls ``join`` with it, and ``world_once`` shares among
    them."""

    def __init__(self, size: int) -> None:
        self.size = size


def join(world: ThreadWorld) -> None:
    """Make this thread one of ``world``'s ranks, for ``world_once``."""
    _JOINED.world = world


class _Entry:
    """One call's value (or the exception it raised), and how many of the world's ranks have yet to read it."""

    def __init__(self, readers: int) -> None:
        self.done = threading.Event()
        self.value: Any = None
        self.error: BaseException | None = None
        self.readers = readers


def _world(comm: Any) -> tuple[object, int] | None:
    """The in-process world of 2+ thread ranks that ``comm`` belongs to, and its size; None if none."""
    if isinstance(comm, LocalComm):
        return (comm.fabric, comm.size) if comm.size > 1 else None
    joined = getattr(_JOINED, "world", None)
    if joined is not None and joined.size > 1 and getattr(comm, "size", None) == joined.size:
        return joined, joined.size
    return None


def world_once(comm: Any, fn: Callable, *args: Any, **kwargs: Any) -> Any:
    """``fn(*args, **kwargs)``, computed once for all the thread ranks of ``comm``'s in-process world.

    Every rank of a test body simulates the whole world's reference; on real MPI or Gloo ranks
    each process does, but n thread ranks would do the same work n times under one GIL. So:
    1. On a communicator that is not in an in-process world of 2+ ranks (a ``LocalComm``'s, or a
       ``ThreadWorld`` this thread joined), call ``fn`` and return.
    2. Key the call by ``fn`` and a digest of its arguments (arrays and tensors by dtype, shape
       and bytes), so a rank only ever reads a value computed from exactly its own arguments.
    3. Under one lock, the world's first rank to ask with that key creates its entry; later
       ones find it.
    4. The creator computes outside the lock and publishes the value, or the exception it
       raised; the others wait for it. The ranks share the value: callers must not modify it
       (the reference's functions return new arrays and leave their arguments alone).
    5. Each rank that reads the entry counts itself off; the last of the world's ranks
       removes it. Entries go with the world (its fabric).
    """
    world = _world(comm)
    if world is None:
        return fn(*args, **kwargs)
    key = _digest(fn, args, kwargs)
    with _LOCK:
        table = _ENTRIES.setdefault(world[0], {})
        entry = table.get(key)
        creator = entry is None
        if creator:
            entry = table[key] = _Entry(world[1])
    if creator:
        try:
            entry.value = fn(*args, **kwargs)
        except BaseException as exc:  # noqa: BLE001 - every rank that asks raises it
            entry.error = exc
        finally:
            entry.done.set()
    entry.done.wait()
    with _LOCK:
        entry.readers -= 1
        if entry.readers == 0 and table.get(key) is entry:
            del table[key]
    if entry.error is not None:
        raise entry.error
    return entry.value


def _digest(fn: Callable, args: tuple, kwargs: dict) -> bytes:
    digest = hashlib.sha256()
    digest.update(f"{fn.__module__}.{fn.__qualname__}".encode())
    _feed(digest, (args, sorted(kwargs.items())))
    return digest.digest()


def _feed(digest: "hashlib._Hash", value: Any) -> None:
    if isinstance(value, torch.Tensor):
        value = value.detach().cpu().contiguous().view(-1).view(torch.uint8).numpy().reshape(-1)
        digest.update(b"tensor")
    if isinstance(value, np.ndarray):
        digest.update(f"array {value.dtype} {value.shape}".encode())
        digest.update(np.ascontiguousarray(value).view(np.uint8).reshape(-1).data)
    elif isinstance(value, (list, tuple)):
        digest.update(f"{type(value).__name__} {len(value)}".encode())
        for item in value:
            _feed(digest, item)
    else:
        digest.update(f"{type(value).__name__} {value!r}".encode())
