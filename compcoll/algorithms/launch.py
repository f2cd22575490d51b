"""How an algorithm call runs: blocking in its turn, or queued for the ordering thread (CUDA: on a side stream)."""

from __future__ import annotations

from functools import lru_cache
from typing import Callable

import torch

from ..comm import Communicator
from ..comm.work import Work


@lru_cache(maxsize=None)
def _side_stream(device: torch.device) -> torch.cuda.Stream:
    """The stream asynchronous calls on ``device`` run on (one per device, kept)."""
    return torch.cuda.Stream(device)


def launch(
    comm: Communicator, what: str, call: Callable[[], torch.Tensor], tensors: tuple[torch.Tensor, ...], async_op: bool
) -> torch.Tensor | Work:
    """Run ``call`` (a whole collective algorithm on ``comm``, returning its output tensor).

    1. Blocking: in this rank's order of collectives, on this thread when nothing is
       queued (``Communicator.run``); returns the output.
    2. ``async_op=True``: queued for the communicator's ordering thread; returns its Work.
    3. On CUDA, an asynchronous call runs on a side stream that first waits for the
       caller's stream (an event recorded now); ``tensors`` (every tensor the call reads
       or writes) are marked as used there, so the caching allocator keeps them; ``wait``
       makes the waiting thread's current stream wait for the call's last kernel, as a
       torch.distributed Work does, and marks the output as used there.
    The caller must leave ``tensors`` alone until ``wait`` returns.
    """
    if not async_op:
        return comm.run(call, what)
    device = tensors[0].device
    if device.type != "cuda":
        return comm.submit(call, what)
    side = _side_stream(device)
    ready = torch.cuda.Event()
    ready.record(torch.cuda.current_stream(device))
    for tensor in tensors:
        tensor.record_stream(side)
    done = torch.cuda.Event()

    def on_side() -> torch.Tensor:
        with torch.cuda.device(device), torch.cuda.stream(side):
            side.wait_event(ready)
            result = call()
            done.record(side)
        return result

    def on_wait(result: torch.Tensor) -> None:
        current = torch.cuda.current_stream(device)
        current.wait_event(done)
        result.record_stream(current)

    return comm.submit(on_side, what, on_wait)


def settle_device(device: torch.device) -> None:
    """Make the current stream of ``device`` (a CUDA one; nothing elsewhere) wait for the asynchronous calls' side
    stream there, so that what it runs next reads what those calls wrote (a checkpoint of their error buffers)."""
    if device.type == "cuda":
        torch.cuda.current_stream(device).wait_stream(_side_stream(device))
