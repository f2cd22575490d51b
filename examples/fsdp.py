"""FSDP2 training where compcoll is one line: ``compcoll.fsdp.compress(model)`` after ``fully_shard``.

Run under torchrun (Gloo on CPUs, NCCL on GPUs):
    torchrun --nproc-per-node 4 examples/fsdp.py                     # 3-bit reduce-scatter (the default)
    torchrun --nproc-per-node 4 examples/fsdp.py --bits 32           # FSDP's own float32 reduce-scatter
    torchrun --nproc-per-node 4 examples/fsdp.py --form replicas     # HSDP: 2 "nodes" of 2, 1 bit across them
The task is examples/train.py's synthetic 10-class problem (nothing is downloaded), trained with
AdamW. Rank 0 prints the loss and the bytes compcoll's state sent since it was built; at
half-way every rank saves its state and the run resumes from it (a new state); at the end
every rank checks that the replicas of its shard (HSDP) are bit-identical.
"""

import argparse

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

import compcoll
import compcoll.fsdp

p = argparse.ArgumentParser()
p.add_argument("--form", default="reduce_scatter", choices=["reduce_scatter", "replicas"])
p.add_argument("--bits", type=int, default=3, help="bits per element; 32: FSDP's own reduce-scatter")
p.add_argument("--steps", type=int, default=200)
p.add_argument("--batch", type=int, default=64, help="per rank")
args = p.parse_args()

comm = compcoll.init()  # torchrun: initialises torch.distributed (Gloo, or NCCL where there is a GPU)
torch.manual_seed(0)
teacher = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.Tanh(), torch.nn.Linear(64, 10))


def build():
    """The model, its blocks and root FSDP units, compcoll's state on them, and AdamW."""
    torch.manual_seed(1)
    model = torch.nn.Sequential(torch.nn.Linear(32, 512), torch.nn.ReLU(), torch.nn.Linear(512, 512),
                                torch.nn.ReLU(), torch.nn.Linear(512, 10))
    mesh, replicas = None, None
    if args.form == "replicas":  # HSDP by hand: shard inside a "node" of 2 ranks, replicate across nodes
        grid = init_device_mesh(comm.device.type, (comm.size // 2, 2), mesh_dim_names=("replicate", "shard"))
        mesh, replicas = grid["shard"], grid.get_group("replicate")
    for layer in (model[0], model[2]):
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    state = None
    if args.form == "replicas":
        state = compcoll.fsdp.compress(model, replicas=replicas)                  # the one line (HSDP)
    elif args.bits != 32:
        state = compcoll.fsdp.compress(model, bits=args.bits)                     # the one line
    return model, torch.optim.AdamW(model.parameters(), lr=2e-3), state


model, opt, state = build()
gen = torch.Generator().manual_seed(1000 + comm.rank)
for step in range(1, args.steps + 1):
    x = torch.randn(args.batch, 32, generator=gen)
    with torch.no_grad():
        y = teacher(x).argmax(dim=1)
    loss = torch.nn.functional.cross_entropy(model(x), y)
    loss.backward()
    opt.step()
    opt.zero_grad()
    if comm.rank == 0 and (step % 50 == 0 or step == 1):
        sent = f"  compcoll's state sent {state.comm.bytes_sent / 1e6:.3f} MB" if state else ""
        print(f"step {step:4d}  loss {loss.item():.4f}{sent}")
    if step == args.steps // 2:  # save and resume, as a job restarted from its checkpoint would
        saved = {"model": model.state_dict(), "optim": opt.state_dict(),
                 "compcoll": state.state_dict() if state else None}
        model, opt, state = build()
        model.load_state_dict(saved["model"])
        opt.load_state_dict(saved["optim"])
        if state:
            state.load_state_dict(saved["compcoll"])

shards = [None] * comm.size  # every rank's shard; under HSDP, ranks r and r + 2 hold the same one
dist.all_gather_object(shards, torch.cat([q.to_local().detach().reshape(-1) for q in model.parameters()]))
same = all(torch.equal(shards[r], shards[r % 2]) for r in range(comm.size)) if args.form == "replicas" else True
print(f"{args.form} on rank {comm.rank} of {comm.size}: replicas bit-identical: {same}")
compcoll.shutdown()
