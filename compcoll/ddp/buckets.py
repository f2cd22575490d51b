"""What the DDP hooks share: the warm-up schedule, plain allreduce and non-finite buckets."""

from __future__ import annotations

import torch
import torch.distributed as dist

from ..comm.work import Work
from ..errors import NonFiniteError


def plain_allreduce(buffer: torch.Tensor, group: dist.ProcessGroup | None) -> torch.futures.Future:
    """DDP's own hook on ``buffer``: the float sum over ``group`` divided by its size (``allreduce_hook``)."""
    size = dist.get_world_size(group)
    work = dist.all_reduce(buffer, group=group, async_op=True)
    return work.get_future().then(lambda fut: fut.value()[0].div_(size))


def settle(work: Work, buffer: torch.Tensor) -> torch.futures.Future:
    """A future of the call's result, or of ``buffer`` filled with NaN when any rank's bucket held NaN / Inf.

    1. When the call's own future completes, ``work.wait()`` gives the result (on CUDA it
       also makes the completing thread's current stream wait for the call's last kernel).
    2. Every rank learns of a non-finite input in the call's agreement and raises
       ``NonFiniteError`` alike, with no error buffer changed; answering NaN on every rank
       is what DDP's own allreduce gives, so a ``GradScaler`` skips the step on every rank.
    3. On CUDA the future is CUDA-aware (``torch.futures.Future(devices=...)``), completed
       after step 1 on that thread: DDP's ``wait`` makes the stream it copies the bucket out
       on (the backward's, a non-default one too) wait for the call, as an NCCL future does.
    """
    def result() -> torch.Tensor:
        try:
            return work.wait()
        except NonFiniteError:
            return buffer.fill_(float("nan"))

    if not buffer.is_cuda:
        return work.get_future().then(lambda _: result())
    future: torch.futures.Future = torch.futures.Future(devices=[buffer.device])

    def complete(_: torch.futures.Future) -> None:
        try:
            future.set_result(result())
        except Exception as error:  # the call's own error (or the future's refusal): DDP's wait raises it, never hangs
            future.set_exception(error)

    work.get_future().add_done_callback(complete)
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

    def started(self) -> bool:
        """Whether this iteration compresses (its large buckets)."""
        return self.iteration >= self.start_iter

    def compress(self, bucket: dist.GradBucket) -> bool:
        """Whether this bucket goes compressed in this iteration."""
        return self.started() and bucket.buffer().numel() >= self.min_compress_numel

    def advance(self, bucket: dist.GradBucket) -> None:
        """Count an iteration at its last bucket."""
        if bucket.is_last():
            self.iteration += 1
