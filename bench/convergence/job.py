"""One rank of the convergence benchmark: one task (tasks.py), data-parallel, one optimizer."""

from __future__ import annotations

import json
import time

import torch

import compcoll
from compcoll.algorithms.exact import exact_average
from compcoll.optim import Birder, OneBitAdam, OneBitLamb, ZeroOneAdam
from compcoll.optim.channel import Channel
from compcoll.workspace import Workspace
from tasks import TASKS


class ExactBirder(Birder):
    """Birder's uncompressed baseline: the same steps, with the exact float32 average of the ranks' ratios m / b
    in place of the 1-bit hierarchical estimate (what Birder is when nothing is compressed)."""

    def _combine(self, ratio: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        return exact_average(ratio, self.comm, out, self.workspace)


class ExactChannel(Channel):
    """A 1-bit channel with nothing compressed: the exact float32 average, and no error buffers."""

    def __init__(self, comm: compcoll.Communicator, workspace: Workspace) -> None:
        self.comm = comm
        self.workspace = workspace

    def __call__(self, tensor: torch.Tensor, out: torch.Tensor, step: int | None = None) -> torch.Tensor:
        """The exact average, in one collective without an agreement round (``step`` is not checked)."""
        return exact_average(tensor, self.comm, out, self.workspace)

    def forget(self, coordinates: torch.Tensor) -> None:
        """Nothing to forget: no error buffers."""

    def reset(self) -> None:
        """Nothing to reset: no error buffers."""

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        """Nothing to load: no error buffers."""

    def to(self, device: torch.device) -> None:
        """Nothing to move: no error buffers."""


class Uncompressed:
    """Mixin for an optimizer of ``compcoll.optim``: its 1-bit channel is an ``ExactChannel``, so it runs its own
    steps with the exact average wherever it would send 1 bit."""

    def _error_feedback(self, ranks_per_node: int | None, hierarchical: bool | None, scale: str = "l2",
                        protocol: str = "auto", by_layer: bool = False) -> ExactChannel:
        self._channel = ExactChannel(self.comm, self.workspace)
        return self._channel


class FrozenVarianceLamb(Uncompressed, OneBitLamb):
    """1-bit LAMB with nothing compressed: after the freeze, the exact average of what it would send in 1 bit.

    What is left is its frozen variance (and fresh trust ratios); 1-bit LAMB's gap to this
    run is what its compression costs, and this run's gap to LAMB what freezing v costs.
    """


class FrozenVarianceAdam(Uncompressed, OneBitAdam):
    """1-bit Adam with nothing compressed: after the freeze, the exact average of what it would send in 1 bit.

    What is left is Adam with its variance frozen; 1-bit Adam's gap to this run is what its
    compression costs, and this run's gap to Adam what freezing v costs.
    """


class ExactZeroOneAdam(Uncompressed, ZeroOneAdam):
    """0/1 Adam with nothing compressed: its variance freeze and local steps, the exact average wherever it sends
    1 bit.

    0/1 Adam's gap to this run is what its compression costs, and this run's gap to Adam
    what its local steps and frozen variance cost (local steps see one rank's share of the
    batch, so that part changes with n).
    """


OPTIMIZERS = {"OneBitAdam": OneBitAdam, "OneBitLamb": OneBitLamb, "ZeroOneAdam": ZeroOneAdam, "Birder": Birder,
              "ExactBirder": ExactBirder, "FrozenVarianceAdam": FrozenVarianceAdam,
              "FrozenVarianceLamb": FrozenVarianceLamb, "ExactZeroOneAdam": ExactZeroOneAdam}


class AveragedAdam:
    """The uncompressed baseline: torch.optim.Adam on the exact average of the ranks' gradients,
    clipped to norm ``clip`` first where it is not 0."""

    def __init__(self, params, comm: compcoll.Communicator, clip: float = 0.0, **kwargs) -> None:
        self.params = list(params)
        self.comm = comm
        self.clip = clip
        self.adam = torch.optim.Adam(self.params, **kwargs)
        self.steps = 0

    def zero_grad(self) -> None:
        self.adam.zero_grad()

    def step(self) -> None:
        flat = torch.cat([p.grad.reshape(-1) for p in self.params])
        exact_average(flat, self.comm, flat)
        torch.nn.utils.vector_to_parameters(flat, [p.grad for p in self.params])
        if self.clip:
            torch.nn.utils.clip_grad_norm_(self.params, self.clip)
        self.adam.step()
        self.steps += 1


class DeepSpeedOneBitAdam:
    """The peer: DeepSpeed 0.19.6's own OnebitAdam in its engine, on Gloo (bench/peers/deepspeed_shim.py).

    1. ``deepspeed.initialize`` wraps the model with fp32, ZeRO off, the global batch split
       over the ranks, and OnebitAdam with ``comm_backend_name="compressed"`` (its
       torch.distributed backend, the one that runs on CPU). The engine clips gradients to
       norm ``gradient_clipping`` (0: not at all; DeepSpeed's default is 1.0): the averaged
       ones during warmup, each rank's own once compression starts.
    2. ``backward`` is the engine's: the loss's gradients, then (during warmup) the engine's
       allreduce of them; ``step`` is the engine's. As in DeepSpeed, the first step only sets
       up the error buffers and leaves the parameters alone.
    """

    def __init__(self, model: torch.nn.Module, comm: compcoll.Communicator, batch: int, gradient_clipping: float,
                 **kwargs) -> None:
        import deepspeed_shim

        deepspeed = deepspeed_shim.load()
        config = {"train_batch_size": batch, "train_micro_batch_size_per_gpu": batch // comm.size,
                  "gradient_clipping": gradient_clipping,
                  "optimizer": {"type": "OneBitAdam", "params": {**kwargs, "comm_backend_name": "compressed"}}}
        self.engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)

    def zero_grad(self) -> None:
        self.engine.zero_grad()

    def backward(self, loss: torch.Tensor) -> None:
        self.engine.backward(loss)

    def step(self) -> None:
        self.engine.step()


def train(comm: compcoll.Communicator, config_json: str) -> None:
    """Train with one optimizer; rank 0 writes the curve and the byte counts to config["out"] (JSON).

    1. Every rank takes its own share of each global batch (the same batches in every run).
    2. With ``config["clip"]`` (0 or absent: none) gradients are clipped to that norm: the
       baselines' averaged ones and DeepSpeed's as its engine does, compcoll's optimizers'
       each rank's own before its step (what their users can do).
    3. Every ``eval_every`` steps rank 0 records the task's evaluation (training loss and its
       metric: test accuracy, validation loss) of its own parameters.
    4. At the end every rank's ``comm.bytes_sent`` and its intra-node / inter-node split
       (``compcoll.topology(comm).traffic``) are gathered (DeepSpeed's traffic goes around
       compcoll's counters: its run reads 0 bytes, and the report leaves them out).
    """
    config = json.loads(config_json)
    task = TASKS[config["task"]](config)
    model = task.model
    kind, kwargs, clip = config["optimizer"], config["kwargs"], config.get("clip", 0.0)
    if kind == "Adam":
        opt = AveragedAdam(model.parameters(), comm, clip, **kwargs)
    elif kind == "DeepSpeedOneBitAdam":
        opt = DeepSpeedOneBitAdam(model, comm, config["batch"], clip, **kwargs)
    else:
        opt = OPTIMIZERS[kind](model.parameters(), comm=comm, **kwargs)
    local_clip = clip if kind in OPTIMIZERS else 0.0
    backward = getattr(opt, "backward", torch.Tensor.backward)
    curve = []
    layout = compcoll.topology(comm)
    start_traffic = layout.traffic(comm)
    start_bytes, start = comm.bytes_sent, time.perf_counter()
    for step in range(config["steps"] + 1):
        if step % config["eval_every"] == 0 or step == config["steps"]:
            curve.append({"step": step, **task.evaluate(), "bytes": comm.bytes_sent - start_bytes})
        if step == config["steps"]:
            break
        opt.zero_grad()
        backward(task.loss(step, comm.rank, comm.size))
        if local_clip:
            torch.nn.utils.clip_grad_norm_(model.parameters(), local_clip)
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
