"""A module's buffers (BatchNorm's running statistics, counters) made rank 0's on every rank, as DDP does."""

from __future__ import annotations

import zlib

import torch

from ..algorithms.agreement import agree_settings
from ..algorithms.rounds import checked
from ..comm import Communicator, communicator

WHAT = "broadcast_buffers"


def broadcast_buffers(module: torch.nn.Module, comm: Communicator | None = None, root: int = 0) -> int:
    """Copy rank ``root``'s buffers of ``module`` into every rank's, bit for bit; returns the bytes broadcast.

    compcoll's optimizers keep the parameters identical on every rank, not a module's
    buffers: each rank's BatchNorm updates its running statistics from its own batches, so
    without this the replicas evaluate (and save) differently. DDP with
    ``broadcast_buffers=True`` (its default) copies rank 0's buffers before every forward;
    call this where that matters to you: every step as DDP does, or before evaluating or
    saving. A collective: every rank calls it at the same point.

    1. List ``module.buffers()`` in order (persistent or not, as DDP does).
    2. One agreement round over their names, shapes, dtypes and devices and over ``root``:
       ranks holding other buffers raise ``RankMismatchError`` on every rank; a ``root``
       that is not a rank raises ``ValueError`` on the ranks that gave it, ``RemoteError``
       on the others. Nothing has changed then.
    3. Per device, the buffers' bytes packed into one uint8 vector, broadcast from
       ``root`` and unpacked in place (each one's bytes copied out first: a view as its
       dtype needs an aligned start): exact for every dtype.

    Args:
        module: the model (the same structure on every rank).
        comm: the communicator; None means ``compcoll.get_default()``.
        root: the rank whose buffers every rank takes (0 by default, as DDP).
    """
    comm = communicator(comm, "broadcast_buffers")
    named = list(module.named_buffers())
    layout = repr([(name, tuple(b.shape), str(b.dtype), b.device.type) for name, b in named])
    total = sum(b.numel() * b.element_size() for _, b in named)

    def check() -> None:
        if isinstance(root, bool) or not isinstance(root, int) or not 0 <= root < comm.size:
            raise ValueError(f"{WHAT}: root must be a rank of this {comm.size}-rank communicator, got {root!r}")

    checked(comm, WHAT, check)
    agree_settings(comm, WHAT, {"buffer layouts (names, shapes, dtypes, devices)": zlib.crc32(layout.encode()),
                                "roots": root})
    by_device: dict[torch.device, list[torch.Tensor]] = {}
    for _, buffer in named:
        if buffer.numel():
            by_device.setdefault(buffer.device, []).append(buffer)
    with torch.no_grad():
        for device, buffers in by_device.items():
            packed = torch.cat([b.detach().contiguous().view(-1).view(torch.uint8) for b in buffers])
            comm.bcast(packed, root)
            offset = 0
            for b in buffers:
                size = b.numel() * b.element_size()
                b.copy_(packed[offset:offset + size].clone().view(b.dtype).view(b.shape))
                offset += size
    return total
