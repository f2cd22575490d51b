"""One rank of the convergence benchmark: an MLP on scikit-learn's bundled digits, data-parallel, one optimizer."""

from __future__ import annotations

import json
import time

import numpy as np
import torch

import compcoll
from compcoll.algorithms.exact import exact_average
from compcoll.optim import Birder, OneBitAdam, OneBitLamb, ZeroOneAdam

OPTIMIZERS = {"OneBitAdam": OneBitAdam, "OneBitLamb": OneBitLamb, "ZeroOneAdam": ZeroOneAdam, "Birder": Birder}


def load_digits() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The 1797 8x8 digits that ship inside scikit-learn (no download): a fixed 80/20 split, pixels / 16."""
    from sklearn.datasets import load_digits as bundled

    data = bundled()
    order = np.random.default_rng(0).permutation(len(data.target))
    x = torch.tensor(data.data[order] / 16.0, dtype=torch.float32)
    y = torch.tensor(data.target[order], dtype=torch.int64)
    cut = int(0.8 * len(y))
    return x[:cut], y[:cut], x[cut:], y[cut:]


def make_model(hidden: int) -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(64, hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, hidden), torch.nn.ReLU(),
        torch.nn.Linear(hidden, 10),
    )


class AveragedAdam:
    """The uncompressed baseline: torch.optim.Adam on the exact average of the ranks' gradients."""

    def __init__(self, params, comm: compcoll.Communicator, **kwargs) -> None:
        self.params = list(params)
        self.comm = comm
        self.adam = torch.optim.Adam(self.params, **kwargs)
        self.steps = 0

    def zero_grad(self) -> None:
        self.adam.zero_grad()

    def step(self) -> None:
        flat = torch.cat([p.grad.reshape(-1) for p in self.params])
        exact_average(flat, self.comm, flat)
        torch.nn.utils.vector_to_parameters(flat, [p.grad for p in self.params])
        self.adam.step()
        self.steps += 1


def train(comm: compcoll.Communicator, config_json: str) -> None:
    """Train with one optimizer; rank 0 writes the curve and the byte counts to config["out"] (JSON).

    1. Every rank takes its own quarter of each global batch (same batch order in every run).
    2. Every ``eval_every`` steps rank 0 records the loss on the whole training set and the
       test accuracy of its own parameters.
    3. At the end every rank's ``comm.bytes_sent`` and its intra-node / inter-node split
       (``compcoll.topology(comm).traffic``) are gathered.
    """
    config = json.loads(config_json)
    x_train, y_train, x_test, y_test = load_digits()
    model = make_model(config["hidden"])
    kind, kwargs = config["optimizer"], config["kwargs"]
    if kind == "Adam":
        opt = AveragedAdam(model.parameters(), comm, **kwargs)
    else:
        opt = OPTIMIZERS[kind](model.parameters(), comm=comm, **kwargs)
    per_rank = config["batch"] // comm.size
    rng = np.random.default_rng(config["seed"])
    order = np.concatenate([rng.permutation(len(y_train)) for _ in range(config["steps"] * config["batch"] // len(y_train) + 2)])
    curve = []
    layout = compcoll.topology(comm)
    start_traffic = layout.traffic(comm)
    start_bytes, start = comm.bytes_sent, time.perf_counter()
    for step in range(config["steps"] + 1):
        if step % config["eval_every"] == 0 or step == config["steps"]:
            with torch.no_grad():
                loss = torch.nn.functional.cross_entropy(model(x_train), y_train).item()
                accuracy = (model(x_test).argmax(dim=1) == y_test).float().mean().item()
            curve.append({"step": step, "train_loss": loss, "test_accuracy": accuracy,
                          "bytes": comm.bytes_sent - start_bytes})
        if step == config["steps"]:
            break
        index = order[step * config["batch"]:(step + 1) * config["batch"]][comm.rank * per_rank:(comm.rank + 1) * per_rank]
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x_train[index]), y_train[index]).backward()
        opt.step()
    seconds = time.perf_counter() - start
    traffic = [now - before for now, before in zip(layout.traffic(comm), start_traffic)]
    sent = torch.tensor([float(comm.bytes_sent - start_bytes), *map(float, traffic)], dtype=torch.float64)
    every = torch.empty(3 * comm.size, dtype=torch.float64)
    comm.allgather(sent, every)
    every = every.view(comm.size, 3)
    if comm.rank == 0:
        result = {"name": config["name"], "optimizer": kind, "kwargs": kwargs, "world_size": comm.size,
                  "params": sum(p.numel() for p in model.parameters()), "curve": curve,
                  "bytes_per_rank": every[:, 0].tolist(), "intra_bytes_per_rank": every[:, 1].tolist(),
                  "inter_bytes_per_rank": every[:, 2].tolist(), "nodes": layout.nodes, "seconds": seconds,
                  "skipped_steps": getattr(opt, "skipped_steps", 0)}
        with open(config["out"], "w") as f:
            json.dump(result, f)
