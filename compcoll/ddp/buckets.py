"""What the DDP hooks share: the warm-up schedule, plain allreduce, odd buckets, and what a bucket must be."""

from __future__ import annotations

from typing import Any, Callable

import torch
import torch.distributed as dist

from ..comm.work import Work, complete_future
from ..errors import NonFiniteError


DDP_REMEDY = ("build the state on the group DDP averages over ({owner}(process_group=...), the group or mesh "
              "dimension DDP was given), or, under DDP's init_sync=False, start the replicas alike")
"""What a hook state on another group than DDP's replicas should do (``algorithms.replicas``), by its class name."""


def check_bucket(hook: str, bucket: Any) -> None:
    """Refuse what is not a DDP bucket: ``torch.compile``'s Python reducer (``optimize_ddp = "python_reducer"``
    with compiled autograd) calls hooks on one ``(gradient, parameter)`` pair at a time, which leaves no bucket to
    compress and no future to complete; every rank meets it at the same call, so every rank raises alike."""
    if not isinstance(bucket, dist.GradBucket):
        raise TypeError(
            f"compcoll.ddp.{hook}: DDP passed a {type(bucket).__name__}, not a GradBucket: torch.compile's Python "
            f"reducer (torch._dynamo.config.optimize_ddp = 'python_reducer') calls hooks per parameter; keep "
            f"optimize_ddp at its default (DDPOptimizer, which keeps DDP's buckets and compcoll's hooks), or use a "
            f"compcoll optimizer with local_hook")


def dense(bucket: dist.GradBucket) -> bool:
    """Whether the bucket holds dense gradients: DDP gives a sparse gradient (``nn.Embedding(sparse=True)``) a bucket
    of its own, which goes by DDP's own allreduce (``plain_allreduce``): it sends only the rows a step touched."""
    return not bucket.buffer().is_sparse


def plain_allreduce(buffer: torch.Tensor, group: dist.ProcessGroup | None) -> torch.futures.Future:
    """DDP's own hook on ``buffer``: the float sum over ``group`` divided by its size (``allreduce_hook``)."""
    size = dist.get_world_size(group)
    work = dist.all_reduce(buffer, group=group, async_op=True)
    return work.get_future().then(lambda fut: fut.value()[0].div_(size))


def in_float32(average: Callable[[torch.Tensor], torch.futures.Future], buffer: torch.Tensor
               ) -> torch.futures.Future:
    """``average(buffer)`` (a compressed average in place), where the codecs take a float64 bucket through float32.

    DDP's buckets are float64 for float64 and complex128 parameters (complex ones viewed as
    pairs of reals); the codecs take float32, float16 and bfloat16.
    1. Any other dtype: ``average(buffer)``.
    2. float64: ``average`` of a float32 copy, copied back into ``buffer`` when it completes
       (its error, if any, is the returned future's). The 1-bit codes and their scales are
       float32 either way; what the copy rounds off (below 2^-24 of each value) is not
       kept in the error buffer, and a value beyond float32's range (3.4e38) counts as Inf:
       the bucket is NaN on every rank (``settle``).
    """
    if buffer.dtype != torch.float64:
        return average(buffer)
    copy = buffer.float()
    return average(copy).then(lambda future: buffer.copy_(future.value()))


def settle(work: Work, buffer: torch.Tensor) -> torch.futures.Future:
    """A future of the call's result, or of ``buffer`` filled with NaN when any rank's bucket held NaN / Inf.

    1. When the call's own future completes, ``work.wait()`` gives the result (on CUDA it
       also makes the completing thread's current stream wait for the call's last kernel).
    2. Every rank learns of a non-finite input in the call's agreement and raises
       ``NonFiniteError`` alike, with no error buffer changed; answering NaN on every rank
       is what DDP's own allreduce gives, so a ``GradScaler`` skips the step on every rank.
       The error's traceback is dropped: it runs through the frames that complete the call's
       future (torch's ``set_result``, which holds that future, which holds the error in C++,
       out of the garbage collector's sight), and would keep them, the call and its error for
       the life of the process, one per skipped step.
    3. The future is ``_completed``'s: CUDA-aware for a CUDA bucket.
    """
    def result() -> torch.Tensor:
        try:
            return work.wait()
        except NonFiniteError as error:
            error.__traceback__ = None
            return buffer.fill_(float("nan"))

    return _completed(work.get_future(), result, buffer)


def gather(futures: list[torch.futures.Future], buffer: torch.Tensor) -> torch.futures.Future:
    """A future of ``buffer`` once every one of ``futures`` (the calls that wrote its parts) has completed.

    1. When all have completed, wait for each in turn: the first one's error, if any, is the
       returned future's error (a part left unaveraged must not pass for a result), and on
       CUDA each wait makes the completing thread's current stream wait for that part.
    2. The future is ``_completed``'s: CUDA-aware for a CUDA bucket (``collect_all``'s own
       future holds no device, so DDP's wait would not make its stream wait for the parts).
    """
    def result() -> torch.Tensor:
        for future in futures:
            future.wait()
        return buffer

    return _completed(torch.futures.collect_all(futures), result, buffer)


def _completed(source: torch.futures.Future, result: Callable[[], torch.Tensor], buffer: torch.Tensor
               ) -> torch.futures.Future:
    """A future completed with ``result()`` once ``source`` completes, or with the error ``result`` raises.

    1. Make a future, CUDA-aware for a CUDA ``buffer`` (``torch.futures.Future(devices=...)``).
    2. Complete it on the thread that completes ``source``, with ``result()`` or its error (the
       future's refusal of its value too), which DDP's wait raises, as a copy of its type,
       message and attributes (``comm.work.complete_future``): it never hangs. On CUDA
       ``result()`` has made that thread's current stream wait for the work, and DDP's ``wait``
       makes the stream it copies the bucket out on (the backward's, a non-default one too)
       wait in turn, as an NCCL future does.
    """
    future: torch.futures.Future = torch.futures.Future(devices=[buffer.device] if buffer.is_cuda else None)

    def complete(_: torch.futures.Future) -> None:
        try:
            complete_future(future, result(), None)
        except Exception as error:
            complete_future(future, None, error)

    source.add_done_callback(complete)
    return future


class Schedule:
    """When a hook compresses: after ``start_iter`` iterations, and buckets of at least ``min_compress_numel`` elements.

    DDP rebuilds its buckets after the first iteration (in the order the gradients
    became ready), so state kept per bucket index is only meaningful from then on; the
    first ``start_iter`` iterations go uncompressed. An iteration ends with the bucket
    whose ``is_last()`` is True.
    """

    def __init__(self, start_iter: int, min_compress_numel: int) -> None:
        for name, value in (("start_iter", start_iter), ("min_compress_numel", min_compress_numel)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"compcoll.ddp: {name} must be a non-negative integer, got {value!r}")
        self.start_iter = start_iter
        self.min_compress_numel = min_compress_numel
        self.iteration = 0

    def settings(self) -> dict[str, int]:
        """What every rank's schedule must hold alike (``agreement.agree_settings``)."""
        return {"start iterations (start_iter)": self.start_iter,
                "smallest compressed buckets (min_compress_numel)": self.min_compress_numel}

    def started(self) -> bool:
        """Whether this iteration compresses (its large buckets)."""
        return self.iteration >= self.start_iter

    def compress(self, bucket: dist.GradBucket) -> bool:
        """Whether this bucket goes compressed in this iteration (a sparse one never does: ``dense``)."""
        return self.started() and dense(bucket) and bucket.buffer().numel() >= self.min_compress_numel

    def advance(self, bucket: dist.GradBucket) -> None:
        """Count an iteration at its last bucket."""
        if bucket.is_last():
            self.iteration += 1
