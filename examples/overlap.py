"""Overlap communication with backward: start each layer's 1-bit allreduce as soon as its gradient is ready.

Run under any launcher: ``mpiexec -n 2 python examples/overlap.py`` or
``torchrun --nproc-per-node 2 examples/overlap.py``. What DDP does with buckets, written
with compcoll's asynchronous calls:
1. A hook on every parameter (``register_post_accumulate_grad_hook``) starts
   ``allreduce(grad, key=name, async_op=True)`` (a ``CompressedAllreduce``) the moment backward
   has accumulated that parameter's gradient, while backward goes on with earlier layers.
2. Before the optimizer step, wait for every Work and put the averages in place.
3. Momentum SGD on the averaged gradients; every rank applies the same bits, so the
   replicas stay identical (checked at the end).
It prints the time of backward plus communication both ways: blocking calls after
backward, and asynchronous calls started during it. Ranks on one small machine have no
wire time to hide (their "network" is memory, and backward and the kernels share the
cores), so expect no gain there; across nodes on a slow link the wire is what it hides.
"""

import time

import torch

import compcoll

comm = compcoll.init()
torch.manual_seed(0)
model = torch.nn.Sequential(*[torch.nn.Sequential(torch.nn.Linear(512, 512), torch.nn.Tanh()) for _ in range(6)],
                            torch.nn.Linear(512, 10))
for p in model.parameters():
    comm.bcast(p.data.view(-1))
allreduce = compcoll.CompressedAllreduce(comm)
opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
pending: dict[str, tuple[torch.nn.Parameter, compcoll.comm.work.Work]] = {}
overlap = True


def start(name: str):
    def hook(param: torch.nn.Parameter) -> None:
        if overlap:
            pending[name] = (param, allreduce(param.grad, key=name, async_op=True))
    return hook


for name, p in model.named_parameters():
    p.register_post_accumulate_grad_hook(start(name))

gen = torch.Generator().manual_seed(1 + comm.rank)
teacher = torch.nn.Linear(512, 10)
times = {True: [], False: []}
for step in range(40):
    overlap = step % 2 == 0
    x = torch.randn(256, 512, generator=gen)
    loss = torch.nn.functional.mse_loss(model(x), teacher(x).detach())
    opt.zero_grad()
    comm.barrier()
    begin = time.perf_counter()
    loss.backward()
    if overlap:
        for name, (param, work) in pending.items():
            param.grad.copy_(work.wait())
        pending.clear()
    else:
        for name, p in model.named_parameters():
            p.grad.copy_(allreduce(p.grad, key=name))
    times[overlap].append(time.perf_counter() - begin)
    opt.step()

flat = torch.cat([p.data.view(-1) for p in model.parameters()])
table = torch.empty(comm.size * flat.numel())
comm.allgather(flat, table)
identical = all(torch.equal(row, table.view(comm.size, -1)[0]) for row in table.view(comm.size, -1))
if comm.rank == 0:
    blocking, started = (sorted(times[k])[len(times[k]) // 2] * 1e3 for k in (False, True))
    print(f"{comm.size} ranks, {flat.numel()} parameters in {len(list(model.parameters()))} tensors; "
          f"backward + allreduce, median: blocking after backward {blocking:.1f} ms, "
          f"started during backward {started:.1f} ms")
    print(f"last loss {loss.item():.4f}; replicas bit-identical: {identical}")
compcoll.shutdown()
