"""A custom optimizer on compcoll in a few dozen lines: momentum SGD with error-feedback 1-bit momentum.

Run under any launcher: ``mpiexec -n 4 python examples/custom_optimizer.py`` or
``torchrun --nproc-per-node 4 examples/custom_optimizer.py``.
"""

import torch

import compcoll


class OneBitMomentumSGD(torch.optim.Optimizer):
    """Momentum SGD whose momentum is averaged over ranks in 1 bit per element.

    Per parameter and step:
    1. m = momentum * m + grad (this rank's gradient).
    2. m = compressed_allreduce(m): the error-compensated 1-bit average, the same on every
       rank (``CompressedAllreduce`` keeps the error buffers per key).
    3. p -= lr * m.
    """

    def __init__(self, params, lr: float, momentum: float = 0.9, comm: compcoll.Communicator | None = None):
        super().__init__(params, dict(lr=lr, momentum=momentum))
        self.comm = compcoll.get_default() if comm is None else comm
        self.allreduce = compcoll.CompressedAllreduce(self.comm)
        for group in self.param_groups:
            for p in group["params"]:
                self.comm.bcast(p.data.view(-1), root=0)  # replicas start identical

    @torch.no_grad()
    def step(self):
        for g, group in enumerate(self.param_groups):
            for i, p in enumerate(group["params"]):
                m = self.state[p].setdefault("momentum", torch.zeros_like(p))
                m.mul_(group["momentum"]).add_(p.grad)
                self.allreduce(m, key=(g, i), out=m)
                p.add_(m, alpha=-group["lr"])

    def state_dict(self):
        return {"optimizer": super().state_dict(), "error_feedback": self.allreduce.state_dict()}

    def load_state_dict(self, state):
        super().load_state_dict(state["optimizer"])
        self.allreduce.load_state_dict(state["error_feedback"])


if __name__ == "__main__":
    comm = compcoll.init()
    torch.manual_seed(comm.rank)
    model = torch.nn.Linear(20, 1)
    target = torch.arange(20.0) / 20
    opt = OneBitMomentumSGD(model.parameters(), lr=0.02, comm=comm)
    gen = torch.Generator().manual_seed(comm.rank)
    for step in range(1, 201):
        x = torch.randn(32, 20, generator=gen)
        loss = ((model(x).squeeze(1) - x @ target) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        if comm.rank == 0 and step % 50 == 0:
            print(f"step {step}: loss {loss.item():.5f}, {comm.bytes_sent} bytes sent")
    if comm.rank == 0:
        print(f"weight error vs the target: {(model.weight.detach().squeeze(0) - target).abs().max().item():.4f}")
    compcoll.shutdown()
