"""The thread's recording of a call's device work for replay (algorithms.replay; docs/architecture.md, "Replays")."""

from __future__ import annotations

import threading
from typing import Any, Callable, Sequence

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten, tree_unflatten

Step = tuple[Callable[..., Any], tuple, Any]
"""One recorded step: a function, its arguments, and the GPU whose context its launch needs (``NO_CONTEXT``: none, a
collective or a counted launch of meta tensors; ``CALL_TENSORS``: a torch operator, which takes the call's tensors
first)."""
NO_CONTEXT = None
"""A step's context: none (a collective; a launch of meta tensors, which only counts)."""
CALL_TENSORS = "call tensors"
"""A step's context: a torch operator, run with the replayed call's tensors."""
_UNISSUED = {torch.ops.aten.detach.default, torch.ops.aten.lift_fresh.default, torch.ops.aten.alias.default}
"""Operators that issue no work, besides views."""


class Recording:
    """The device work one run of a call's device part issued, in order, or why it cannot be replayed.

    A replay runs ``steps`` again and nothing else, so the recording is void where the run did anything else: a
    torch operator that allocates or returns a new tensor (``Guard``; one that writes into its arguments, a copy or
    an in-place division, is a step), a value read to the host, or an asynchronous collective.

    Args:
        tensors: the call's own tensors (the replay's key), of which it keeps only where they lie: a launch argument
            in them is not kept alive by the recording, whose next call brings those tensors itself; a torch operator
            gets its views of them made anew from the next call's tensors (``_Keyed``).
    """

    def __init__(self, tensors: Sequence[torch.Tensor] = ()) -> None:
        self.keyed = tuple((t.data_ptr(), t.data_ptr() + t.numel() * t.element_size()) for t in tensors)
        """The (first, last) byte addresses of each call tensor."""
        self.sizes = tuple(t.element_size() for t in tensors)
        """The element size of each call tensor."""
        self.steps: list[Step] = []
        self.signature: list[tuple] = []
        """What each step did, comparable between two recordings: its kernel, grid and every argument's value
        (a view's address, shape, strides and dtype), or its collective."""
        self.keep: list[Any] = []
        self.void: str | None = None
        self._quiet = 0

    def keyed_index(self, address: int, empty: bool = False) -> int | None:
        """Which call tensor ``address`` lies in (that of an ``empty`` view: in or just past it), or None."""
        return next((i for i, (first, last) in enumerate(self.keyed)
                     if first <= address < last or (empty and address == last)), None)

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

    def operator(self, func: Callable[..., Any], args: tuple, kwargs: dict) -> None:
        """Add a torch operator that wrote into its arguments: the call's own tensors among them as ``_Keyed`` views
        (the others, workspace buffers, kept alive)."""
        leaves, spec = tree_flatten((args, kwargs))
        template, signature = [], []
        for leaf in leaves:
            if isinstance(leaf, torch.Tensor):
                index = None if leaf.is_meta else self.keyed_index(leaf.data_ptr(), leaf.numel() == 0)
                if index is not None:
                    leaf = self._keyed_view(index, leaf)
                    if leaf is None:
                        return
                    signature.append(("call tensor", index, leaf.dtype, leaf.shape, leaf.stride, leaf.offset))
                else:
                    signature.append((leaf.data_ptr(), leaf.shape, leaf.stride(), leaf.dtype))
            else:
                signature.append((type(leaf), leaf))
            template.append(leaf)
        made_args, made_kwargs = tree_unflatten(template, spec)
        at = tuple(i for i, a in enumerate(made_args) if type(a) is _Keyed)
        keys = tuple(k for k, v in made_kwargs.items() if type(v) is _Keyed)
        if sum(type(leaf) is _Keyed for leaf in template) == len(at) + len(keys):
            self.steps.append((_run_operator, (func, tuple(made_args), made_kwargs, at, keys), CALL_TENSORS))
        else:
            self.steps.append((_run_nested_operator, (func, spec, tuple(template)), CALL_TENSORS))
        self.signature.append((func, spec, *signature))

    def _keyed_view(self, index: int, tensor: torch.Tensor) -> _Keyed | None:
        """``tensor``, in call tensor ``index``'s memory, as a view to make from the call's tensors; None (and void)
        where its element size is not that tensor's."""
        if tensor.element_size() != self.sizes[index]:
            self.refuse("a torch operator on a view of a call tensor with another element size")
            return None
        offset = (tensor.data_ptr() - self.keyed[index][0]) // tensor.element_size()
        return _Keyed(index, tensor.dtype, tuple(tensor.shape), tensor.stride(), offset)

    def refuse(self, why: str) -> None:
        """Make the recording void (the first reason is kept)."""
        if self.void is None:
            self.void = why

    @property
    def quiet(self) -> bool:
        """Whether a collective is running (its torch operators are its own)."""
        return self._quiet > 0


class _Keyed:
    """A torch operator's argument in a call tensor's memory: a view of call tensor ``index`` as ``dtype`` (of its
    element size), ``shape`` and ``stride`` from element ``offset``, made from each replayed call's own tensor."""

    __slots__ = ("index", "dtype", "shape", "stride", "offset")

    def __init__(self, index: int, dtype: torch.dtype, shape: tuple[int, ...], stride: tuple[int, ...],
                 offset: int) -> None:
        self.index, self.dtype, self.shape, self.stride, self.offset = index, dtype, shape, stride, offset

    def of(self, tensors: list[torch.Tensor]) -> torch.Tensor:
        """The view of this call's tensor ``index``."""
        base = tensors[self.index]
        base = base if base.dtype == self.dtype else base.view(self.dtype)
        return base.as_strided(self.shape, self.stride, base.storage_offset() + self.offset)


def _run_operator(tensors: list[torch.Tensor], func: Callable[..., Any], args: tuple, kwargs: dict, at: tuple[int, ...],
                  keys: tuple[str, ...]) -> None:
    """A recorded torch operator run again, its views of the call's tensors (arguments ``at`` and keyword arguments
    ``keys``, ``_Keyed``) made from ``tensors``."""
    if at:
        args = list(args)
        for i in at:
            args[i] = args[i].of(tensors)
    if keys:
        kwargs = dict(kwargs)
        for k in keys:
            kwargs[k] = kwargs[k].of(tensors)
    func(*args, **kwargs)


def _run_nested_operator(tensors: list[torch.Tensor], func: Callable[..., Any], spec: Any, template: tuple) -> None:
    """``_run_operator`` for an operator with a view of the call's tensors inside a list (``aten.cat``'s)."""
    args, kwargs = tree_unflatten([leaf.of(tensors) if type(leaf) is _Keyed else leaf for leaf in template], spec)
    func(*args, **kwargs)


class Guard(TorchDispatchMode):
    """Adds to ``recording`` each torch operator outside a collective that writes into its arguments
    (``Recording.operator``), and voids it at one that allocates or returns a new tensor: work a replay of its steps
    would not do (views and detaches are nothing to replay)."""

    def __init__(self, recording: Recording) -> None:
        super().__init__()
        self.recording = recording

    def __torch_dispatch__(self, func: Callable[..., Any], types: tuple, args: tuple = (),
                           kwargs: dict | None = None) -> Any:
        done = func(*args, **(kwargs or {}))
        if not (self.recording.quiet or func.is_view or func in _UNISSUED):
            if func._schema.is_mutable:
                self.recording.operator(func, args, kwargs or {})
            else:
                self.recording.refuse(f"the torch operator {func}")
        return done


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
