"""Tells when every rank hands an optimizer the same gradient: averaged before it, or every rank on the same batch."""

from __future__ import annotations

import zlib

import torch

PROBED_STEPS = 3
"""The first steps whose agreement round also carries a fingerprint of each rank's gradient (one host read each)."""
SAMPLES = 8
"""How many of the gradient's elements, spread over it, the fingerprint reads."""
ALL_ZERO = -1.0
"""The fingerprint of samples that are all zero: they tell nothing (coordinates no batch reaches)."""


def fingerprint(grad: torch.Tensor) -> float:
    """A CRC-32 of ``SAMPLES`` elements of ``grad`` spread evenly over it, as an exact float, or ``ALL_ZERO``.

    Ranks that train on their own batches hold other gradients, so their fingerprints differ
    (sampled float32 values equal bit for bit on every rank, by chance, once in 2^32).
    """
    numel = grad.numel()
    positions = torch.arange(min(SAMPLES, numel)) * (numel // min(SAMPLES, numel)) + (numel // (2 * SAMPLES))
    samples = grad[positions.clamp_(max=numel - 1).to(grad.device)].cpu()
    if not bool(samples.any()):
        return ALL_ZERO
    return float(zlib.crc32(samples.numpy().tobytes()))


def same_everywhere(prints: list[float]) -> bool:
    """Whether every rank's fingerprint is the same and tells something (several ranks, samples not all zero)."""
    return len(prints) > 1 and prints[0] != ALL_ZERO and all(p == prints[0] for p in prints)


def warning(what: str, step: int) -> str:
    """The warning for gradients that were the same on every rank at ``step``."""
    return (f"{what}: at step {step} every rank handed the optimizer the same gradient (bit for bit), so either "
            f"something averaged it before the step (a framework's DistributedDataParallel around the model: "
            f"register compcoll.ddp.local_hook on it, or every step sends float32 and then the optimizer's bytes: "
            f"6.6x the bytes in bench/results/convergence_ddp_framework.txt), or every rank trains on the same "
            f"batches (shard the data, e.g. with torch.utils.data.DistributedSampler)")
