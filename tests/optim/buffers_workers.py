"""Rank-side bodies of the tests that ``broadcast_buffers`` makes every rank's buffers rank ``root``'s."""

from __future__ import annotations

import torch

import compcoll
from compcoll.launcher import seeded
from compcoll.optim import OneBitAdam, broadcast_buffers
from tests.algorithms.onebit_workers import assert_same_on_all_ranks


class Normed(torch.nn.Module):
    """A BatchNorm model (float32 running statistics, an int64 0-dim counter) with a bfloat16 and a bool buffer, one
    buffer left non-persistent."""

    def __init__(self) -> None:
        super().__init__()
        self.hidden = torch.nn.Linear(6, 5)
        self.norm = torch.nn.BatchNorm1d(5)
        self.out = torch.nn.Linear(5, 2)
        self.register_buffer("half_stat", torch.zeros(3, dtype=torch.bfloat16))
        self.register_buffer("seen", torch.zeros(7, dtype=torch.bool), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            self.half_stat.add_(x[:3, 0].to(torch.bfloat16))
            self.seen |= x[:7, 1] > 0
        return self.out(torch.relu(self.norm(self.hidden(x))))


def _train(comm: compcoll.Communicator, steps: int = 4, device: str = "cpu") -> Normed:
    """A few 1-bit Adam steps on this rank's own batches (on ``device``; "cuda": this rank's GPU): the parameters
    agree, the buffers do not."""
    with seeded(5):
        model = Normed()
    if device == "cuda":
        model.to(torch.device("cuda", torch.cuda.current_device()))
    opt = OneBitAdam(model.parameters(), lr=1e-2, freeze_step=2, comm=comm)
    gen = torch.Generator().manual_seed(100 + comm.rank)
    for _ in range(steps):
        loss = model(torch.randn(16, 6, generator=gen).to(next(model.parameters()).device)).square().mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    return model


def buffers_become_roots(comm: compcoll.Communicator, root: int, device: str = "cpu") -> None:
    """After training (on ``device``), every buffer equals rank ``root``'s bit for bit on every rank (root's
    unchanged), where before they differed (more than one rank), and the bytes are every buffer's."""
    model = _train(comm, device=device)
    before = {name: b.clone() for name, b in model.named_buffers()}
    if comm.size > 1:
        differ = torch.tensor([float(any(not torch.equal(b, before[n]) for n, b in _others(comm, model, root)))])
        assert differ.item() or comm.rank == root, "the ranks' buffers agreed before the broadcast: nothing shown"
    sent = broadcast_buffers(model, comm, root)
    assert sent == sum(b.numel() * b.element_size() for b in before.values())
    for name, b in model.named_buffers():
        assert b.dtype == before[name].dtype and b.shape == before[name].shape, name
        host = b.detach().cpu()
        assert_same_on_all_ranks(comm, host.reshape(-1).view(torch.uint8) if b.dtype != torch.bool
                                 else host.to(torch.uint8))
        if comm.rank == root:
            assert torch.equal(b, before[name]), f"{name}: the root's buffer changed"


def _others(comm: compcoll.Communicator, model: Normed, root: int) -> list[tuple[str, torch.Tensor]]:
    """Rank ``root``'s running mean beside this rank's (gathered), as (name, root's) pairs."""
    mean = model.norm.running_mean.detach()
    table = torch.empty(comm.size * mean.numel(), device=mean.device)
    comm.allgather(mean.clone(), table)
    return [("norm.running_mean", table.view(comm.size, -1)[root])]


def mismatched_buffers_fail_everywhere(comm: compcoll.Communicator) -> None:
    """The last rank's model has one more buffer: RankMismatchError naming the layouts on every rank; a root that is
    not a rank: ValueError on every rank that gave it; nothing changed."""
    model = _train(comm, 1)
    before = {name: b.clone() for name, b in model.named_buffers()}
    if comm.rank == comm.size - 1:
        model.register_buffer("extra", torch.zeros(2))
    try:
        broadcast_buffers(model, comm)
    except compcoll.RankMismatchError as exc:
        assert "buffer layouts" in str(exc), exc
    else:
        raise AssertionError(f"no error on rank {comm.rank}")
    if comm.rank == comm.size - 1:
        del model.extra
    try:
        broadcast_buffers(model, comm, root=comm.size)
    except ValueError as exc:
        assert f"root must be a rank of this {comm.size}-rank communicator, got {comm.size}" in str(exc), exc
    else:
        raise AssertionError(f"no error on rank {comm.rank}")
    assert all(torch.equal(b, before[name]) for name, b in model.named_buffers())
