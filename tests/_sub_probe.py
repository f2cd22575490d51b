import faulthandler, sys, torch, torch.distributed as dist
import compcoll
from compcoll.optim import OneBitAdam
from compcoll.comm.torchdist import TorchComm
from tests.ddp.ddp_workers import make_model

def probe(comm):
    faulthandler.dump_traceback_later(30, exit=True)
    rank = dist.get_rank()
    groups = [dist.new_group([0, 2]), dist.new_group([1, 3])]
    dp = groups[rank % 2]
    net = make_model()
    c = TorchComm(dp)
    print(rank, "comm", c.rank, c.size, flush=True)
    opt2 = OneBitAdam(net.parameters(), lr=1e-3, freeze_step=2, comm=c)
    print(rank, "opt made", flush=True)
    for i in range(4):
        opt2.zero_grad()
        x, y = torch.randn(4, 300), torch.randn(4, 7)
        torch.nn.functional.mse_loss(net(x), y).backward()
        opt2.step()
        print(rank, "opt step", i, flush=True)
