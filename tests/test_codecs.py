"""Codec layer: wire framing and 16-bit decoding rounded exactly as torch rounds."""

from __future__ import annotations

import pytest
import torch

from compcoll import codecs
from compcoll.kernels import reference


def test_frame_and_unframe() -> None:
    rows = torch.zeros(3, codecs.SCALE_BYTES + 5, dtype=torch.uint8)
    for r in range(3):
        codecs.frame(rows[r], 1.5 * (r + 1)).fill_(r)
    scales, bits = codecs.unframe(rows)
    assert scales.tolist() == [1.5, 3.0, 4.5]
    assert bits.shape == (3, 5) and bits[2].tolist() == [2] * 5


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_decode_rounds_like_torch(dtype: torch.dtype) -> None:
    bits = torch.tensor([[0b10100000], [0b01000000]], dtype=torch.uint8)
    scales = torch.tensor([0.1234567, 3.3333333])
    out = torch.empty(10, dtype=dtype)
    codecs.decode(bits, scales, out)
    signs = torch.tensor([1, -1, 1, -1, -1, -1, -1, -1, -1, 1], dtype=torch.float32)
    expected = (signs * scales.repeat_interleave(8)[:10]).to(dtype)
    assert torch.equal(out.view(torch.uint8), expected.view(torch.uint8))


def test_unsupported_device() -> None:
    with pytest.raises(ValueError, match="not supported"):
        codecs.check_device(torch.empty(1, device="meta"))


def test_sumsq_matches_the_reference_order() -> None:
    for numel in (0, 1, 31, 8193, 100003):
        x = torch.randn(numel, generator=torch.Generator().manual_seed(numel))
        assert codecs.sumsq(x) == reference.sumsq(x.numpy())
