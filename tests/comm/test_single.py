"""comm.single: the one-rank communicator's collectives are copies, of every dtype, on the host by numpy's."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from compcoll import SingleComm


@pytest.mark.parametrize("dtype", [torch.bool, torch.uint8, torch.int32, torch.int64, torch.float16, torch.bfloat16,
                                   torch.float32, torch.float64])
def test_alltoall_and_allgather_copy_every_dtype(dtype: torch.dtype) -> None:
    """An all-to-all and an all-gather of one rank put the sent values into the received tensor, bit for bit, on
    fresh random values of an odd length."""
    rng = np.random.default_rng(53)
    comm = SingleComm()
    values = torch.from_numpy(rng.integers(0, 2 if dtype == torch.bool else 100, 2003)).to(dtype)
    for send in (values, torch.from_numpy(rng.standard_normal(1001)).to(dtype)):
        for collective in (comm.alltoall, comm.allgather):
            recv = torch.zeros_like(send)
            collective(send, recv)
            assert torch.equal(recv, send)


def test_a_tensor_that_requires_grad_is_copied() -> None:
    """A float tensor that requires grad (a parameter) goes through the numpy copy detached."""
    comm = SingleComm()
    send = torch.randn(37, requires_grad=True)
    recv = torch.empty(37)
    comm.allgather(send, recv)
    assert torch.equal(recv, send.detach())
