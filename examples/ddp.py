"""DDP training where compcoll is one line: a communication hook, or a compcoll optimizer under a DDP-wrapped model.

Run under torchrun (Gloo on CPUs, NCCL on GPUs):
    torchrun --nproc-per-node 2 examples/ddp.py --hook onebit      # 1-bit gradients (momentum SGD)
    torchrun --nproc-per-node 2 examples/ddp.py --hook allreduce   # DDP's own float32 allreduce
    torchrun --nproc-per-node 2 examples/ddp.py --hook local       # ZeroOneAdam averages; DDP only wraps
Several hooks, separated by commas, train one after another in the same launch.
The task is examples/train.py's synthetic 10-class problem (nothing is downloaded). Rank 0
prints the loss and, for the hooks, the bytes the 1-bit calls sent against what DDP's ring
allreduce sends for the same buckets; at the end every rank checks its parameters are
bit-identical to rank 0's.
"""

import argparse

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import compcoll
import compcoll.ddp
from compcoll.optim import ZeroOneAdam

HOOKS = ["onebit", "allreduce", "local"]
p = argparse.ArgumentParser()
p.add_argument("--hook", default="onebit",
               help=f"one of {', '.join(HOOKS)}, or several separated by commas (trained one after another)")
p.add_argument("--steps", type=int, default=300)
p.add_argument("--batch", type=int, default=64, help="per rank")
args = p.parse_args()
hooks = args.hook.split(",")
if not set(hooks) <= set(HOOKS):
    p.error(f"--hook {args.hook}: choose from {', '.join(HOOKS)}")
comm = compcoll.init()  # torchrun: initialises torch.distributed (Gloo, or NCCL where there is a GPU)


def train(hook: str) -> None:
    torch.manual_seed(0)
    teacher = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.Tanh(), torch.nn.Linear(64, 10))
    model = DDP(torch.nn.Sequential(torch.nn.Linear(32, 512), torch.nn.ReLU(), torch.nn.Linear(512, 512),
                                    torch.nn.ReLU(), torch.nn.Linear(512, 10)))
    state = None
    if hook == "onebit":
        state = compcoll.ddp.OneBitState()
        model.register_comm_hook(state, compcoll.ddp.onebit_hook)           # the one line
    elif hook == "local":
        model.register_comm_hook(None, compcoll.ddp.local_hook)             # gradients stay local
    if hook == "local":
        opt = ZeroOneAdam(model.parameters(), lr=2e-3, var_freeze_step=args.steps // 5,
                          local_step_scaler=args.steps // 10, eps=1e-4, comm=comm)
    else:
        opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)

    numel = sum(q.numel() for q in model.parameters())
    ring = 2 * (comm.size - 1) * 4 * numel // comm.size   # bytes per step of a float32 ring allreduce
    gen = torch.Generator().manual_seed(1000 + comm.rank)
    for step in range(1, args.steps + 1):
        x = torch.randn(args.batch, 32, generator=gen)
        with torch.no_grad():
            y = teacher(x).argmax(dim=1)
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        if comm.rank == 0 and (step % 50 == 0 or step == 1):
            sent = f"  1-bit calls sent {state.comm.bytes_sent / 1e6:.3f} MB" if state else ""
            # the first state.schedule.start_iter iterations go through DDP's own allreduce, not counted here
            print(f"step {step:4d}  loss {loss.item():.4f}{sent}  (float32 ring: {step * ring / 1e6:.3f} MB)")

    if hook == "local":
        opt.synchronize()
    flat = torch.cat([q.detach().reshape(-1) for q in model.parameters()])
    reference = flat.clone()
    dist.broadcast(reference, src=0)
    same = torch.equal(flat, reference)
    print(f"{hook} on rank {comm.rank} of {comm.size}: replicas bit-identical: {same}")


for hook in hooks:
    train(hook)
compcoll.shutdown()
