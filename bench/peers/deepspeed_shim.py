"""DeepSpeed 0.19.6's 1-bit code on CPU tensors over Gloo: the two shims it needs, and nothing else.

deepspeed 0.19.6 is the newest release that still has ``runtime/fp16/onebit`` and
``runtime/comm/compressed.py``. Its ``CompressedBackend`` runs on CPU over Gloo except for:
1. the packbits op: it ships only an XPU (SYCL) build; ``CpuPacker`` packs and unpacks the
   same way (bit = not signbit(x), most significant bit first; bit 1 -> +1.0, 0 -> -1.0);
2. the scale all-gather: it gathers a 0-dim scale into shape-(1,) buffers, which NCCL
   accepts and Gloo refuses (size mismatch); ``_ScaleAsVector`` views a 0-dim input as (1,).
It also skips one build the 1-bit code never uses: on CPU, ``init_distributed`` compiles the
C++ op ``deepspeed_shm_comm`` (its shared-memory inference allreduce; 42 s on 2 cores, again for
every new environment) and only initialises it; ``load`` marks it incompatible, which DeepSpeed
checks before building.
Everything else (the algorithm, its torch ops, its float32 norms) is DeepSpeed's own code.
Install with ``pip install -e '.[deepspeed]'``; compcoll itself never needs it, only its peer tests and benchmarks.
"""

from __future__ import annotations

import numpy as np
import torch


class CpuPacker:
    """DeepSpeed's packbits op (csrc/xpu/packbits/packing.cpp) on CPU, as numpy's packbits / unpackbits (C loops)."""

    @staticmethod
    def packbits(tensor: torch.Tensor, input_size: int, rank: int) -> torch.Tensor:
        """Bits of ``not signbit`` of the first ``input_size`` floats, 8 per byte, padded with 0 bits."""
        signs = np.signbit(tensor.reshape(-1)[:input_size].numpy())
        return torch.from_numpy(np.packbits(np.logical_not(signs, out=signs)))

    @staticmethod
    def unpackbits(tensor: torch.Tensor, input_size: int, rank: int) -> torch.Tensor:
        """``input_size`` bytes -> 8 * input_size floats of +1.0 / -1.0."""
        bits = torch.from_numpy(np.unpackbits(tensor.reshape(-1)[:input_size].numpy()))
        return bits.to(torch.float32).mul_(2.0).sub_(1.0)


class _CpuPackbitsBuilder:
    """Stands in for ``PackbitsBuilder``: ``load()`` returns the CPU packer."""

    def load(self) -> CpuPacker:
        return CpuPacker()


class _ScaleAsVector:
    """``deepspeed.comm`` with ``all_gather`` viewing a 0-dim input as shape (1,), as Gloo requires."""

    def __init__(self, dist) -> None:
        self._dist = dist

    def __getattr__(self, name: str):
        return getattr(self._dist, name)

    def all_gather(self, tensor_list, tensor, group=None, async_op=False):
        return self._dist.all_gather(tensor_list, tensor.reshape(-1) if tensor.dim() == 0 else tensor, group=group,
                                     async_op=async_op)


def load():
    """Import deepspeed, check its version, install the two shims, skip the shm build; returns ``deepspeed``.

    Call after torch.distributed is initialised with Gloo (``compcoll.launcher`` does so),
    before building a ``CompressedBackend`` or a ``OneBitAdam`` engine.
    """
    import deepspeed
    from deepspeed.runtime.comm import compressed

    if deepspeed.__version__ != "0.19.6":
        raise RuntimeError(f"the DeepSpeed peer is written for deepspeed 0.19.6, found {deepspeed.__version__}")
    deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False
    compressed.PackbitsBuilder = _CpuPackbitsBuilder
    if not isinstance(compressed.dist, _ScaleAsVector):
        compressed.dist = _ScaleAsVector(compressed.dist)
    deepspeed.init_distributed(dist_backend="gloo")
    return deepspeed
