"""One rank of the end-to-end training benchmark: steps per second of a model under each way of averaging gradients."""

# no ``from __future__ import annotations``: DDP checks the hooks' annotations against the classes

import json
import os
import time

import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook
from torch.nn.parallel import DistributedDataParallel as DDP

import compcoll
import compcoll.ddp
from compcoll.optim import OneBitAdam, ZeroOneAdam

METHODS = ("allreduce", "fp16", "powersgd", "onebit", "onebit_hier", "onebit_adam", "zero_one_adam")


def make_model(width: int) -> torch.nn.Module:
    """An MLP whose gradients are large against its compute: 1024 -> width -> width -> 1024 -> 10."""
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(1024, width), torch.nn.ReLU(), torch.nn.Linear(width, width),
                               torch.nn.ReLU(), torch.nn.Linear(width, 1024), torch.nn.ReLU(),
                               torch.nn.Linear(1024, 10))


def prepare(method: str, comm: compcoll.Communicator, width: int) -> tuple[DDP, torch.optim.Optimizer]:
    """The DDP model and optimizer of one method, each in its compressed phase from step 2 on.

    1. allreduce / fp16 / powersgd (rank 4) / onebit / onebit_hier (``ranks_per_node`` from
       ``COMPCOLL_RANKS_PER_NODE``): a DDP hook, momentum SGD. PowerSGD
       gets one bucket: its hook issues allreduces from future callbacks, which over Gloo
       run on Gloo's threads, so with two buckets the ranks issued them in different orders
       (a Gloo size-mismatch abort; PyTorch tests PowerSGD on NCCL only, pytorch#58467).
    2. onebit_adam / zero_one_adam: compcoll's optimizer averages; DDP keeps gradients
       local (``local_hook``); the warmup ends at step 2.
    """
    single = {"bucket_cap_mb": 4096} if method == "powersgd" else {}
    model = DDP(make_model(width), **single)

    def sgd() -> torch.optim.Optimizer:
        return torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)

    if method == "allreduce":
        return model, sgd()
    if method == "fp16":
        model.register_comm_hook(None, default_hooks.fp16_compress_hook)
        return model, sgd()
    if method == "powersgd":
        state = powerSGD_hook.PowerSGDState(None, matrix_approximation_rank=4, start_powerSGD_iter=2)
        model.register_comm_hook(state, powerSGD_hook.powerSGD_hook)
        return model, sgd()
    if method in ("onebit", "onebit_hier"):
        per_node = int(os.environ.get("COMPCOLL_RANKS_PER_NODE", "1")) if method == "onebit_hier" else 1
        model.register_comm_hook(compcoll.ddp.OneBitState(ranks_per_node=per_node), compcoll.ddp.onebit_hook)
        return model, sgd()
    model.register_comm_hook(None, compcoll.ddp.local_hook)
    if method == "onebit_adam":
        return model, OneBitAdam(model.parameters(), lr=1e-4, freeze_step=2, comm=comm)
    return model, ZeroOneAdam(model.parameters(), lr=1e-4, var_freeze_step=2, comm=comm)


def steps(model: torch.nn.Module, opt: torch.optim.Optimizer, x: torch.Tensor, y: torch.Tensor, count: int) -> None:
    """Take ``count`` training steps of ``model`` on the batch (x, y)."""
    for _ in range(count):
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()


def train(comm: compcoll.Communicator, config_json: str) -> None:
    """Time ``steps`` training steps after ``warmup`` ones for every method; rank 0 writes samples/s to config["out"].

    1. Every rank trains on its own random batch of ``batch`` samples per step.
    2. The time of a step is the slowest rank's (a barrier on the default group before and
       after the timed steps); the median of ``runs`` runs of ``steps`` steps is kept.
    """
    config = json.loads(config_json)
    n, width = comm.size, config["width"]
    x = torch.randn(config["batch"], 1024, generator=torch.Generator().manual_seed(comm.rank))
    y = torch.randint(0, 10, (config["batch"],), generator=torch.Generator().manual_seed(comm.rank))
    results = {}
    for method in config["methods"]:
        model, opt = prepare(method, comm, width)
        steps(model, opt, x, y, config["warmup"])
        times = []
        for _ in range(config["runs"]):
            dist.barrier()
            start = time.perf_counter()
            steps(model, opt, x, y, config["steps"])
            dist.barrier()
            times.append(time.perf_counter() - start)
        times.sort()
        seconds = times[len(times) // 2] / config["steps"]
        results[method] = {"step_s": seconds, "samples_per_s": n * config["batch"] / seconds, "runs_s": times}
        if comm.rank == 0:
            print(f"# {method}: {1000 * seconds:.1f} ms/step", flush=True)
        del model, opt
    if comm.rank == 0:
        params = sum(p.numel() for p in make_model(width).parameters())
        with open(config["out"], "w") as f:
            json.dump({"params": params, "world_size": n, "methods": results}, f)
