"""Arrays of other libraries (numpy, cupy: any DLPack exporter) as zero-copy torch views, results handed back."""

from __future__ import annotations

import functools
import inspect
import sys
from typing import Any, Callable, TypeVar

import torch

from ..comm.work import Work

F = TypeVar("F", bound=Callable[..., Any])
ARRAY_ARGUMENTS = ("tensor", "worker_error", "server_error", "out")


def accepts_arrays(function: F) -> F:
    """Let an allreduce (or reduce-scatter) take numpy / cupy arrays where it takes tensors, and return the caller's
    type.

    1. If ``tensor`` (the first parameter, or the first after a method's ``self``) is a torch
       tensor, call ``function`` unchanged (no argument binding: every tensor call's path).
    2. Otherwise view ``tensor`` and any of ``worker_error``, ``server_error`` and ``out``
       that are not tensors through ``torch.from_dlpack`` (no copy; on CUDA, torch's
       stream waits for the producer's). An argument that cannot be viewed (or one the
       call writes that is read-only) is passed on
       as it is, so that the call's own checks refuse it in the ranks' agreement round
       (a ``TypeError`` here, ``RemoteError`` on the other ranks), never a hang.
    3. Return the result as an array of ``tensor``'s library viewing the same memory
       (``out``'s, when given): numpy through ``Tensor.numpy()``, others through their
       ``from_dlpack`` (which orders their stream after torch's). With ``async_op`` the
       ``Work``'s ``wait()`` and future hand back that array. Error buffers passed as
       arrays are updated in place, as tensors are.
    """
    signature = inspect.signature(function)
    names = list(signature.parameters)
    position = 1 if names[:1] == ["self"] else 0
    if names[position:position + 1] != ["tensor"]:
        raise TypeError(f"accepts_arrays: {function.__name__}'s first parameter (after self) must be 'tensor'")

    @functools.wraps(function)
    def call(*args: Any, **kwargs: Any) -> Any:
        if isinstance(args[position] if len(args) > position else kwargs.get("tensor"), torch.Tensor):
            return function(*args, **kwargs)
        bound = signature.bind(*args, **kwargs)
        source = bound.arguments["tensor"]
        for name in ARRAY_ARGUMENTS:
            value = bound.arguments.get(name)
            if value is not None and not isinstance(value, torch.Tensor):
                bound.arguments[name] = _view(value, written=name != "tensor")
        result = function(*bound.args, **bound.kwargs)
        library = _library(source)
        if isinstance(result, Work):
            return ArrayWork(result, library)
        return to_library(result, library)

    return call  # type: ignore[return-value]


def _library(array: Any) -> Any:
    """The module of ``array``'s library (numpy, cupy: the top package of its type), or None where it is not
    imported."""
    return sys.modules.get(type(array).__module__.split(".")[0])


def _view(array: Any, written: bool) -> Any:
    """A torch view of ``array`` through DLPack, or ``array`` itself when it has none to give.

    1. An array the call writes (``written``) that says it is read-only (numpy's
       ``flags.writeable``) is not viewed: torch would write through DLPack regardless.
    2. An array with a negative stride (``a[::-1]``) is not viewed either: torch's
       ``from_dlpack`` aborts the process on one (torch 2.13: "Storage size calculation
       overflowed", thrown where nothing catches it). The input, which the call only reads,
       is viewed through a contiguous copy of its library's (``ascontiguousarray``, as a
       non-contiguous torch tensor is copied); an array the call writes is refused.
    """
    if written and not getattr(getattr(array, "flags", None), "writeable", True):
        return array
    if any(stride < 0 for stride in getattr(array, "strides", None) or ()):
        library = _library(array)
        if written or not hasattr(library, "ascontiguousarray"):
            return array
        array = library.ascontiguousarray(array)
    try:
        return torch.from_dlpack(array)
    except (AttributeError, BufferError, RuntimeError, TypeError, ValueError):
        return array


def to_library(tensor: torch.Tensor, library: Any) -> Any:
    """``tensor`` as an array of ``library`` (a module) viewing the same memory."""
    if library is not None and library.__name__ == "numpy" and tensor.device.type == "cpu":
        return tensor.numpy()
    return library.from_dlpack(tensor)


class ArrayWork(Work):
    """A ``Work`` whose result is handed back as an array of the caller's library (``accepts_arrays``)."""

    def __init__(self, work: Work, library: Any) -> None:
        self._work = work
        self._library = library

    def wait(self, timeout: float | None = None) -> Any:
        return to_library(self._work.wait(timeout), self._library)

    def is_completed(self) -> bool:
        return self._work.is_completed()

    def get_future(self) -> torch.futures.Future:
        return self._work.get_future().then(lambda done: to_library(done.value(), self._library))
