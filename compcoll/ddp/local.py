"""A DDP hook that leaves every gradient local, for a compcoll optimizer on a model a framework wrapped in DDP."""

from typing import Any

import torch
import torch.distributed as dist


def local_hook(state: Any, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """Skip DDP's allreduce: the bucket's gradients stay this rank's own.

    Register it when a compcoll optimizer (``OneBitAdam``, ``OneBitLamb``, ``ZeroOneAdam``,
    ``Birder``) averages the gradients itself and the model is wrapped in DDP anyway
    (Accelerate, Lightning, Trainer): without it every gradient would be averaged twice,
    once uncompressed by DDP.
    ``model.register_comm_hook(None, compcoll.ddp.local_hook)``.

    1. Return a completed future holding the bucket's own buffer (no communication).
    2. Under ``torch.compile``'s Python reducer (``torch._dynamo.config.optimize_ddp =
       "python_reducer"`` with compiled autograd), DDP calls its hooks on one
       ``(gradient, parameter)`` pair at a time and uses no result: leave the gradient as
       it is and return None.

    Args:
        state: unused (DDP passes what was registered; ``None`` will do).
        bucket: the DDP gradient bucket, or the Python reducer's ``(gradient, parameter)``.
    """
    if isinstance(bucket, tuple):
        return None
    future: torch.futures.Future = torch.futures.Future()
    future.set_result(bucket.buffer())
    return future
