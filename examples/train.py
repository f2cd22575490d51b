"""Train a small MLP data-parallel with one of compcoll's optimizers; the optimizer does all communication.

Run under any launcher (each rank draws its own batches):
    mpiexec -n 4 python examples/train.py --optimizer onebit_adam
    torchrun --nproc-per-node 4 examples/train.py --optimizer birder
Optimizers: onebit_adam, onebit_lamb, zero_one_adam, birder; several, separated by commas,
train one after another in the same launch (``--optimizer onebit_adam,birder``). The task is a synthetic
10-class problem labelled by a fixed random teacher network, so nothing is downloaded.
Rank 0 prints the loss, the bytes it has sent and what a plain float32 allreduce of the
gradients every step would have sent; at the end every rank checks that its parameters
are bit-identical to rank 0's.
"""

import argparse

import torch

import compcoll
from compcoll.optim import Birder, OneBitAdam, OneBitLamb, ZeroOneAdam, broadcast_buffers

OPTIMIZERS = ["onebit_adam", "onebit_lamb", "zero_one_adam", "birder"]
p = argparse.ArgumentParser()
p.add_argument("--optimizer", default="onebit_adam",
               help=f"one of {', '.join(OPTIMIZERS)}, or several separated by commas (trained one after another)")
p.add_argument("--steps", type=int, default=300)
p.add_argument("--batch", type=int, default=64, help="per rank")
args = p.parse_args()
names = args.optimizer.split(",")
if not set(names) <= set(OPTIMIZERS):
    p.error(f"--optimizer {args.optimizer}: choose from {', '.join(OPTIMIZERS)}")
comm = compcoll.init()


def make(name: str, params):
    warmup = args.steps // 5
    if name == "onebit_adam":
        return OneBitAdam(params, lr=2e-3, freeze_step=warmup, comm=comm)
    if name == "onebit_lamb":
        return OneBitLamb(params, lr=5e-3, freeze_step=warmup, comm=comm)
    if name == "zero_one_adam":
        return ZeroOneAdam(params, lr=2e-3, var_freeze_step=warmup, local_step_scaler=args.steps // 10,
                           eps=1e-4, comm=comm)  # 0/1 Adam diverges at eps=1e-8 on uneven gradients (docs: Optimizers)
    return Birder(params, lr=1e-3, comm=comm)


def train(name: str) -> None:
    torch.manual_seed(0)
    teacher = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.Tanh(), torch.nn.Linear(64, 10))
    torch.manual_seed(comm.rank)  # different initial weights per rank: the optimizer broadcasts rank 0's
    model = torch.nn.Sequential(torch.nn.Linear(32, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10))
    opt = make(name, model.parameters())
    numel = sum(q.numel() for q in model.parameters())
    plain_per_step = 2 * (comm.size - 1) * 4 * numel // comm.size  # a ring allreduce of float32 gradients
    gen = torch.Generator().manual_seed(1000 + comm.rank)
    start = comm.bytes_sent
    for step in range(1, args.steps + 1):
        x = torch.randn(args.batch, 32, generator=gen)
        with torch.no_grad():
            y = teacher(x).argmax(dim=1)
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        if comm.rank == 0 and (step % 50 == 0 or step == 1):
            sent = comm.bytes_sent - start
            plain = step * plain_per_step
            print(f"step {step:4d}  loss {loss.item():.4f}  sent {sent / 1e6:7.3f} MB  "
                  f"(plain allreduce: {plain / 1e6:7.3f} MB, {plain / max(sent, 1):.1f}x)")

    opt.synchronize()  # 0/1 Adam: average the local steps since the last sync; a no-op for the others
    broadcast_buffers(model, comm)  # module buffers (BatchNorm's statistics) as rank 0's; this MLP has none
    flat = torch.cat([q.detach().reshape(-1) for q in model.parameters()])
    table = torch.empty(comm.size * flat.numel())
    comm.allgather(flat, table)
    identical = all(torch.equal(row, flat) for row in table.view(comm.size, -1))
    if comm.rank == 0:
        print(f"{type(opt).__name__} on {comm.size} ranks: replicas bit-identical: {identical}; "
              f"skipped steps: {opt.skipped_steps}")
    if not identical:
        raise SystemExit(f"rank {comm.rank}: parameters differ from other ranks")


for name in names:
    train(name)
compcoll.shutdown()  # under torchrun: close the process group before the interpreter exits
