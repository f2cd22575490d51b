"""One rank of one run of bench/convergence/fsdp.py: the causal LM under real FSDP2 (fully_shard) over Gloo."""

from __future__ import annotations

import json
import time

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

import compcoll
import compcoll.fsdp
from tasks import TextLM


class Counted(torch.distributed.fsdp._fully_shard._fsdp_api.ReduceScatter):
    """FSDP's own float32 reduce-scatter, counting the bytes a ring sends per rank: (n-1)/n of the input."""

    def __init__(self, bytes_sent: list) -> None:
        self.bytes_sent = bytes_sent

    def allocate(self, size, *, dtype, device):
        return torch.empty(*size, dtype=dtype, device=device)

    def __call__(self, output_tensor, input_tensor, group, op, async_op=False):
        n = dist.get_world_size(group)
        self.bytes_sent[0] += (n - 1) * output_tensor.numel() * output_tensor.element_size()
        return dist.reduce_scatter_single(output=output_tensor, input=input_tensor, group=group, op=op)


def train(comm: compcoll.Communicator, text: str) -> None:
    """Train ``config``'s run with AdamW under FSDP2 and write its curve, bytes and memory per rank (rank 0).

    1. The task's model, its blocks and the root each a ``fully_shard`` unit (HSDP by hand for
       "replicas": units over the ranks of a node of ``ranks_per_node``, ``compress(model,
       replicas=...)`` across nodes).
    2. Each step: this rank's share of the global batch, backward, AdamW on the shards.
    3. Every ``eval_every`` steps: the task's losses, on the unsharded model, on every rank.
    """
    config = json.loads(text)
    n, rank = comm.size, comm.rank
    task = TextLM(config)
    model = task.model
    mesh, replicas = None, None
    if config["form"] == "replicas":
        k = config["ranks_per_node"]
        grid = init_device_mesh("cpu", (n // k, k), mesh_dim_names=("replicate", "shard"))
        mesh, replicas = grid["shard"], grid.get_group("replicate")
    for layer in model.blocks.layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    counted = [0]
    state = None
    options = dict(config["options"])
    if "error_dtype" in options:
        options["error_dtype"] = getattr(torch, options["error_dtype"])
    if config["form"] == "float32":
        for unit in [*model.blocks.layers, model]:
            unit.set_custom_reduce_scatter(Counted(counted))
    elif config["form"] == "replicas":
        state = compcoll.fsdp.compress(model, replicas=replicas, **options)
    else:
        state = compcoll.fsdp.compress(model, **options)
    opt = torch.optim.AdamW(model.parameters(), lr=config["lr"])
    curve, start = [], time.perf_counter()
    for step in range(config["steps"]):
        task.loss(step, rank, n).backward()
        opt.step()
        opt.zero_grad()
        if (step + 1) % config["eval_every"] == 0 or step + 1 == config["steps"]:
            with torch.no_grad():
                curve.append({"step": step + 1, **task.evaluate()})
    sent = counted[0] if state is None else state.comm.bytes_sent
    plain = counted[0]
    if config["form"] == "replicas":  # a float32 ring allreduce of each shard across the replicas
        r = state.comm.size
        plain = config["steps"] * sum(2 * (r - 1) * 4 * p.numel // r for p in state.allreduce.plans.values())
    elif state is not None:  # FSDP's float32 reduce-scatter of the same inputs
        plain = sum(config["steps"] * (n - 1) * 4 * e.numel() // n for e in state.errors.values())
    gathered = [None] * n
    dist.all_gather_object(gathered, {"bytes": sent, "plain": plain,
                                      "memory": 0 if state is None else state.memory()})
    if rank == 0:
        params = sum(p.numel() for p in model.parameters())
        with open(config["out"], "w") as f:
            json.dump({"name": config["name"], "curve": curve, "params": params, "seconds": time.perf_counter() - start,
                       "bytes_per_rank": [g["bytes"] for g in gathered],
                       "float32_bytes_per_rank": [g["plain"] for g in gathered],
                       "memory_per_rank": [g["memory"] for g in gathered]}, f)
