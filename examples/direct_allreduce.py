"""Average a gradient-like tensor over ranks with compcoll.compressed_allreduce.

Run under any launcher: ``mpiexec -n 4 python examples/direct_allreduce.py`` or
``torchrun --nproc-per-node 4 examples/direct_allreduce.py``. Each step compares the
1-bit estimate with an exact allreduce: one step alone is coarse, but with error
feedback the running sum of estimates tracks the running sum of true averages.
"""

import torch

import compcoll

comm = compcoll.init()
numel = 1_000_003
full = compcoll.padded_numel(numel, comm.size)
worker_error = torch.zeros(full)
server_error = torch.zeros(full // comm.size)
gen = torch.Generator().manual_seed(comm.rank)
signal = torch.randn(numel, generator=torch.Generator().manual_seed(-1))
true_sum, estimate_sum = torch.zeros(numel), torch.zeros(numel)

if comm.rank == 0:
    print(f"{comm.size} ranks, {numel} float32 elements; per step: bytes sent by one rank and relative error")
    print("step error: one call's estimate against the exact average. It is large and may grow over the first\n"
          "steps: each call sends only signs and two scales, and hands back what it could not send through the\n"
          "error buffers, which the next call adds in. sum error: the running sum of the estimates against the\n"
          "running sum of the exact averages, which is what an optimizer's steps add up to. It falls, because\n"
          "nothing is lost, only delayed: that is what error feedback buys.")
    print(f"{'step':>4} {'plain bytes':>12} {'1-bit bytes':>12} {'ratio':>6} {'step error':>10} {'sum error':>10}")
for step in range(1, 11):
    grad = signal + torch.randn(numel, generator=gen)
    exact = grad.clone()
    sent = comm.bytes_sent
    comm.allreduce(exact)
    exact /= comm.size
    plain_bytes, sent = comm.bytes_sent - sent, comm.bytes_sent
    estimate = compcoll.compressed_allreduce(grad, worker_error, server_error, comm)
    onebit_bytes = comm.bytes_sent - sent
    true_sum += exact
    estimate_sum += estimate
    if comm.rank == 0:
        step_error = ((estimate - exact).norm() / exact.norm()).item()
        sum_error = ((estimate_sum - true_sum).norm() / true_sum.norm()).item()
        ratio = plain_bytes / onebit_bytes if onebit_bytes else float("nan")
        print(f"{step:>4} {plain_bytes:>12} {onebit_bytes:>12} {ratio:>6.1f} {step_error:>10.3f} {sum_error:>10.3f}")

compcoll.shutdown()  # under torchrun: close the process group before the interpreter exits
