"""codecs.blocks: block scales' codes against ``spec.code_scales``; 16-bit block decodes rounded as torch's."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from compcoll import codecs, spec
from compcoll.kernels import reference
from tests.kernels.cuda_sim_checks import tie_scales


def test_scale_codes_match_the_reference() -> None:
    """``codecs.frame_scales`` (one kernel) = ``spec.code_scales`` (numpy), on scales of every magnitude, zeros,
    subnormals, ties between rows' values and rows of one value; decoding the frame gives the same scales."""
    rng = np.random.default_rng(17)
    rows = [(rng.random(40) * 10.0 ** rng.integers(-20, 20, 40)).astype(np.float32),
            np.zeros(7, np.float32), np.full(5, 3.0, np.float32),
            np.array([1e-45, 1e-40, 1e-38, 0.0, 2e-45], np.float32),
            np.array([1.0, 0.5, 2 ** -0.0625, 2 ** -31.8, 2 ** -40, 3.4e38], np.float32), tie_scales()]
    for row in rows:
        for table in (row.reshape(1, -1), np.stack([row, row[::-1].copy()])):
            refs, codes, decoded = spec.code_scales(table)
            frame = torch.zeros(table.shape[0], 4 + table.shape[1] + 3, dtype=torch.uint8)
            got, rest = codecs.frame_scales(frame, torch.from_numpy(table))
            heads = frame[:, :4].flatten().view(torch.float32)
            assert np.array_equal(heads.numpy(), refs) and np.array_equal(frame[:, 4:4 + table.shape[1]], codes)
            assert np.array_equal(got.numpy(), decoded) and rest.shape == (table.shape[0], 3)
            near = (table >= refs[:, None] * 2.0 ** -31) & (table > 1e-30)  # within the codes' 31 octaves
            assert np.all(np.abs(decoded[near] / table[near] - 1) <= 0.044), "a code off its nearest value"
            assert np.all(decoded <= refs[:, None])
            assert torch.equal(codecs.unframe_blocks(frame, table.shape[1])[0], got)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_block_decode_to_16_bit_rounds_as_torch(dtype: torch.dtype) -> None:
    """``codecs.decode_framed_blocks`` into a 16-bit output = the float32 decode cast by torch, element for element
    (the scales rounded once, their negations by the sign bit), cut at an awkward length; the float32 decode =
    the reference's."""
    rng = np.random.default_rng(11)
    n, block, row_len = 3, 8, 40
    blocks = row_len // block
    scales = (rng.random(n * blocks) * 10.0 ** rng.integers(-6, 6, n * blocks)).astype(np.float32)
    wire = torch.from_numpy(rng.integers(0, 256, (n, codecs.SCALE_BYTES + blocks + row_len // 8), dtype=np.uint8))
    decoded, _ = codecs.frame_scales(wire, torch.from_numpy(scales))
    numel = n * row_len - 5
    full, half = torch.empty(numel), torch.empty(numel, dtype=dtype)
    codecs.decode_framed_blocks(wire, blocks, block, full)
    codecs.decode_framed_blocks(wire, blocks, block, half)
    signs = reference.unpack(wire[:, codecs.SCALE_BYTES + blocks:].numpy().reshape(-1), n * row_len)
    want = np.repeat(decoded.numpy().reshape(-1), block) * signs
    assert np.array_equal(full.numpy(), want[:numel].astype(np.float32))
    assert torch.equal(half.view(torch.int16), full.to(dtype).view(torch.int16))
