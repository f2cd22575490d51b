"""Hook states built before ``init_process_group`` on real Gloo ranks, run by torchrun (tests/ddp/test_onebit.py)."""

import torch.distributed as dist

import compcoll
from tests.ddp.ddp_workers import built_before_init, states_built_before_init

if __name__ == "__main__":
    early = built_before_init()
    dist.init_process_group("gloo")
    states_built_before_init(compcoll.TorchComm(), early, 4)
    print(f"rank {dist.get_rank()}: the states built before init_process_group trained the same bits")
    dist.destroy_process_group()
