"""Peer compressions for the benchmark: PyTorch's fp16 and PowerSGD DDP communication hooks on the same group."""

from __future__ import annotations

import math
from typing import Any, Callable

import torch
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook
from torch.nn.parallel import DistributedDataParallel

from ..comm import Communicator

PEERS = ("fp16", "powersgd")
POWERSGD_WARMUP = 2


class _Inject(torch.autograd.Function):
    """Forward gives a zero scalar; backward hands ``grad`` to the weight as its gradient."""

    @staticmethod
    def forward(ctx: Any, weight: torch.Tensor, grad: torch.Tensor) -> torch.Tensor:
        ctx.grad = grad
        return weight.new_zeros(())

    @staticmethod
    def backward(ctx: Any, _: torch.Tensor) -> tuple[torch.Tensor, None]:
        return ctx.grad, None


class _Weight(torch.nn.Module):
    """One parameter whose gradient is whatever tensor the forward is given."""

    def __init__(self, shape: tuple[int, int]) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.zeros(shape))

    def forward(self, grad: torch.Tensor) -> torch.Tensor:
        return _Inject.apply(self.weight, grad)


def matrix_shape(count: int) -> tuple[int, int]:
    """(rows, cols) with rows * cols == count and rows the largest divisor <= sqrt(count).

    PowerSGD compresses a gradient as a matrix (a vector it allreduces uncompressed), so the
    benchmark's tensor is given the squarest shape its length allows.
    """
    rows = next(r for r in range(math.isqrt(count), 0, -1) if count % r == 0)
    return rows, count // rows


def hook_bytes(name: str, world_size: int, count: int, rank: int = 1) -> int:
    """Bytes one rank sends per step for the allreduces the hook ``name`` runs on ``count`` float32 elements.

    Counted as compcoll counts an allreduce (a ring sends 2 (n - 1) / n of the tensor):
    1. fp16: the bucket in float16.
    2. powersgd (after its warmup): P (rows x r) and Q (cols x r) in float32, for the
       ``matrix_shape`` of ``count`` and r = min(rank, rows, cols).
    """
    def ring(nbytes: int) -> int:
        return 2 * (world_size - 1) * nbytes // world_size

    if name == "fp16":
        return ring(2 * count)
    if name == "powersgd":
        rows, cols = matrix_shape(count)
        r = min(rank, rows, cols)
        return ring(4 * r * rows) + ring(4 * r * cols)
    raise ValueError(f"unknown peer method {name!r}; known: {', '.join(PEERS)}")


def ddp_hook_step(comm: Communicator, x: torch.Tensor, name: str, rank: int = 1) -> tuple[Callable, Callable]:
    """(step, result) running one DDP gradient allreduce of ``x`` through a comm hook.

    1. A module with one parameter of ``x``'s length, shaped by ``matrix_shape``, wrapped in
       DistributedDataParallel on ``comm``'s torch.distributed group: one bucket, no initial
       broadcast.
    2. The hook: ``fp16`` is ``fp16_compress_hook`` (cast to float16 / n, allreduce, cast
       back); ``powersgd`` is ``powerSGD_hook`` with ``matrix_approximation_rank=rank``,
       error feedback and warm start, as PyTorch's defaults have them.
    3. ``step()`` is what a training step costs: forward, then backward, in which DDP runs
       the hook on the gradient ``x`` and writes the average into the parameter's grad.
       For PowerSGD the first POWERSGD_WARMUP steps (plain allreduce by its design) run here.
    ``result()`` returns the averaged gradient of the last step, on the CPU.
    Where CUDA is available the module and gradient live on the current GPU (Gloo moves
    CUDA tensors): PyTorch's PowerSGD hook synchronises the bucket's device whenever CUDA
    is available, which fails for a CPU bucket ("Expected a cuda device, but got: cpu").
    """
    group = getattr(comm, "group", None)
    if group is None or getattr(comm, "backend", None) != "gloo":
        raise ValueError(
            f"method {name!r} runs PyTorch's DDP hooks, which need a torch.distributed Gloo group: "
            f"launch with torchrun or --backend gloo (this communicator is {type(comm).__name__})"
        )
    device = torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")
    model = DistributedDataParallel(
        _Weight(matrix_shape(x.numel())).to(device), process_group=group,
        bucket_cap_mb=x.numel() * 4 / (1 << 20) + 1,
    )
    if name == "fp16":
        model.register_comm_hook(group, default_hooks.fp16_compress_hook)
    elif name == "powersgd":
        state = powerSGD_hook.PowerSGDState(
            group, matrix_approximation_rank=rank, start_powerSGD_iter=POWERSGD_WARMUP
        )
        model.register_comm_hook(state, powerSGD_hook.powerSGD_hook)
    else:
        raise ValueError(f"unknown peer method {name!r}; known: {', '.join(PEERS)}")
    grad = x.to(device).view(model.module.weight.shape)

    def step() -> None:
        model.module.weight.grad = None
        model(grad).backward()

    for _ in range(POWERSGD_WARMUP if name == "powersgd" else 0):
        step()
    return step, lambda: model.module.weight.grad.flatten().cpu()
