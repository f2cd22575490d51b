"""One rank of the DDP convergence benchmark: the digits MLP under real DDP with one optimizer and one gradient hook."""

# no ``from __future__ import annotations``: DDP checks the hooks' annotations against the classes

import json
import time

import numpy as np
import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook
from torch.nn.parallel import DistributedDataParallel as DDP

import compcoll
import compcoll.ddp
import compcoll.optim
from tasks import load_digits, make_model


def ring_bytes(numel: int, element: int, n: int) -> int:
    """Bytes one rank sends in a ring allreduce of ``numel`` elements: 2 (n-1)/n of the buffer."""
    return 2 * (n - 1) * numel * element // n


def hooked(model: DDP, hook: str, options: dict, n: int) -> tuple[list[int], object]:
    """Register ``hook`` on ``model``; returns a one-element counter of the bytes this rank sends and its state.

    Bytes: compcoll's calls from their communicator's counter (added at the end); DDP's
    own allreduce (uncompressed buckets, fp16) by the ring formula; PowerSGD's allreduces
    of P and Q by the ring formula on their sizes.
    """
    counted = [0]
    if hook == "local":
        model.register_comm_hook(None, compcoll.ddp.local_hook)
        return counted, None
    if hook == "allreduce":
        def plain(state, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
            counted[0] += ring_bytes(bucket.buffer().numel(), 4, n)
            return default_hooks.allreduce_hook(state, bucket)
        model.register_comm_hook(None, plain)
        return counted, None
    if hook == "fp16":
        def half(state, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
            counted[0] += ring_bytes(bucket.buffer().numel(), 2, n)
            return default_hooks.fp16_compress_hook(state, bucket)
        model.register_comm_hook(None, half)
        return counted, None
    if hook == "powersgd":
        state = powerSGD_hook.PowerSGDState(process_group=None, **options)
        model.register_comm_hook(state, _powersgd_counting(state, counted, n))
        return counted, state
    state = compcoll.ddp.OneBitState(**options)

    def onebit(hook_state, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
        if not hook_state.schedule.compress(bucket):
            counted[0] += ring_bytes(bucket.buffer().numel(), 4, n)
        return compcoll.ddp.onebit_hook(hook_state, bucket)
    model.register_comm_hook(state, onebit)
    return counted, state


def _powersgd_counting(state, counted: list[int], n: int):
    """PowerSGD's hook, counting what it sends: the uncompressed first iterations and small tensors in full, the
    P and Q factors (ring) of each compressed matrix otherwise, as PyTorch's own hook decides."""
    def counting(hook_state, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
        if hook_state.iter < hook_state.start_powerSGD_iter:
            counted[0] += ring_bytes(bucket.buffer().numel(), 4, n)
        else:
            for tensor in bucket.gradients():
                rows, cols = tensor.shape[0], tensor.numel() // tensor.shape[0]
                rank = min(rows, cols, hook_state.matrix_approximation_rank)
                compress = (tensor.ndimension() > 1
                            and (rows + cols) * rank * hook_state.min_compression_rate < rows * cols)
                counted[0] += ring_bytes((rows + cols) * rank if compress else tensor.numel(), 4, n)
        return powerSGD_hook.powerSGD_hook(hook_state, bucket)
    return counting


def optimizer(model: DDP, config: dict, comm: compcoll.Communicator) -> torch.optim.Optimizer:
    """config["optimizer"]: "sgd" (momentum 0.9, the default), "adam", or "onebit_adam" (compcoll's 1-bit Adam,
    warming up for config["freeze"] of the run and averaging over ``comm`` itself), built after DDP wraps the model,
    as frameworks do."""
    kind = config.get("optimizer", "sgd")
    if kind == "sgd":
        return torch.optim.SGD(model.parameters(), lr=config["lr"], momentum=0.9)
    if kind == "adam":
        return torch.optim.Adam(model.parameters(), lr=config["lr"])
    return compcoll.optim.OneBitAdam(model.parameters(), lr=config["lr"], freeze_step=config["freeze"],
                                     total_steps=config["steps"], comm=comm)


def train(comm: compcoll.Communicator, config_json: str) -> None:
    """Train under DDP with one hook; rank 0 writes the curve and bytes to config["out"] (JSON).

    1. Every rank takes its share of each global batch (the same batch order in every run).
    2. Every ``eval_every`` steps rank 0 records the loss on the whole training set and the
       test accuracy.
    3. Replicas are checked bit-identical at the end.
    """
    config = json.loads(config_json)
    x_train, y_train, x_test, y_test = load_digits()
    n = comm.size
    model = DDP(make_model(config["hidden"]))
    counted, state = hooked(model, config["hook"], config["options"], n)
    opt = optimizer(model, config, comm)
    per_rank = config["batch"] // n
    rng = np.random.default_rng(config["seed"])
    order = np.concatenate([rng.permutation(len(y_train))
                            for _ in range(config["steps"] * config["batch"] // len(y_train) + 2)])

    def sent() -> int:
        return (counted[0] + (state.comm.bytes_sent if isinstance(state, compcoll.ddp.OneBitState) else 0)
                + (opt.comm.bytes_sent if isinstance(opt, compcoll.optim.OneBitAdam) else 0))

    curve, start = [], time.perf_counter()
    for step in range(config["steps"] + 1):
        if step % config["eval_every"] == 0 or step == config["steps"]:
            with torch.no_grad():
                loss = torch.nn.functional.cross_entropy(model.module(x_train), y_train).item()
                accuracy = (model.module(x_test).argmax(dim=1) == y_test).float().mean().item()
            curve.append({"step": step, "train_loss": loss, "test_accuracy": accuracy, "bytes": sent()})
        if step == config["steps"]:
            break
        batch = order[step * config["batch"]:(step + 1) * config["batch"]]
        index = batch[comm.rank * per_rank:(comm.rank + 1) * per_rank]
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x_train[index]), y_train[index]).backward()
        opt.step()
    seconds = time.perf_counter() - start
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    first = flat.clone()
    dist.broadcast(first, src=0)
    identical = torch.tensor([float(torch.equal(flat, first))])
    dist.all_reduce(identical, op=dist.ReduceOp.MIN)
    every = [None] * n
    dist.all_gather_object(every, sent())
    if comm.rank == 0:
        result = {"name": config["name"], "hook": config["hook"], "options": config["options"], "world_size": n,
                  "params": flat.numel(), "curve": curve, "bytes_per_rank": every, "seconds": seconds,
                  "replicas_identical": bool(identical.item())}
        with open(config["out"], "w") as f:
            json.dump(result, f)
