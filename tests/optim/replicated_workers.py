"""Rank-side bodies of the same-gradient warning's tests: real Gloo ranks, torch's DDP around the model or not."""

from __future__ import annotations

import warnings

import torch
from torch.nn.parallel import DistributedDataParallel as DDP

import compcoll
import compcoll.ddp
from compcoll.launcher import seeded
from tests.optim.optim_workers import CONFIGS, Net, batch

SAID = "every rank handed the optimizer the same gradient"


def _warnings(comm: compcoll.Communicator, name: str, wrap: str | None, same_batches: bool) -> list[str]:
    """The same-gradient warnings of 4 steps of ``name``'s optimizer: the model under torch's DDP (``wrap``: "ddp",
    or "local" with ``compcoll.ddp.local_hook``) or not, each rank on its own batches or all on rank 0's."""
    with seeded(0):
        net = Net()
    model = DDP(net) if wrap else net
    if wrap == "local":
        model.register_comm_hook(None, compcoll.ddp.local_hook)
    cls, kwargs = CONFIGS[name]
    opt = cls(net.parameters(), comm=comm, **kwargs)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for step in range(4):
            tokens, x, y = batch(0 if same_batches else comm.rank, step)
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(tokens, x), y).backward()
            opt.step()
    return [str(w.message) for w in caught if SAID in str(w.message)]


def same_gradients_warn(comm: compcoll.Communicator, name: str) -> None:
    """Gradients averaged before the step (torch's DDP around the model, no local_hook) or every rank on the same
    batches: one warning naming both causes, on every rank (both sent nothing wrong but the bytes, or the compute,
    silently); each rank on its own batches, alone or under DDP with local_hook: none."""
    for wrap, same in ((None, True), ("ddp", False)):
        said = _warnings(comm, name, wrap, same)
        assert len(said) == 1 and "register compcoll.ddp.local_hook" in said[0] and "DistributedSampler" in \
            said[0], (wrap, same, said)
    for wrap in (None, "local"):
        assert not _warnings(comm, name, wrap, False), wrap
