"""codecs.signs: wire frames, encodes and decodes against the reference; 16-bit decodes rounded as torch's."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import assume, given
from hypothesis import strategies as st

from compcoll import codecs
from compcoll.kernels import reference
from compcoll.spec import SCALES, STAGES, padded_numel, stream_key
from tests.codecs.drawn import DTYPES, PROPERTY, same, vectors


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


@pytest.mark.parametrize("scale", list(SCALES))
@pytest.mark.parametrize("dtype", DTYPES)
@PROPERTY
@given(data=st.data(), world=st.integers(1, 4))
def test_compensate_encode_matches_the_reference(dtype: torch.dtype, scale: str, data, world: int) -> None:
    x = data.draw(vectors(dtype))
    full = padded_numel(x.numel(), world)
    error = data.draw(vectors(torch.float32, full))
    padded = reference.pad(x.float().numpy(), full)
    total = codecs.compensated_sum(x, error, scale)
    value = codecs.scale_from(total, full, scale)
    bits = torch.empty(full // 8, dtype=torch.uint8)
    work = error.clone()
    codecs.compensate_encode(x, work, value, bits)
    with np.errstate(over="ignore", invalid="ignore"):  # x + error may overflow float32 here as in the kernel
        want_total = reference.power_sum(padded + error.numpy(), SCALES[scale])
        want_bits, want_scale, want_error = reference.compress(padded, error.numpy(), scale)
    assert same(np.float64(total), np.float64(want_total))
    assert same(np.float32(value), want_scale)
    assert np.array_equal(bits.numpy(), want_bits) and same(work.numpy(), want_error)
    held, held_bits = error.clone(), torch.empty_like(bits)  # the scale held in a tensor, as a device-resident one
    codecs.compensate_encode(x, held, torch.tensor([value], dtype=torch.float32), held_bits)
    assert torch.equal(held_bits, bits) and same(held.numpy(), work.numpy())


@pytest.mark.parametrize("dtype", DTYPES)
@PROPERTY
@given(data=st.data(), ranks=st.integers(1, 4))
def test_decode_matches_the_reference(dtype: torch.dtype, data, ranks: int) -> None:
    numel = data.draw(st.integers(0, 20000))
    row = -(-numel // (8 * ranks))
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1)))
    bits = torch.from_numpy(rng.integers(0, 256, (ranks, row), dtype=np.uint8))
    scales = data.draw(vectors(torch.float32, ranks)).abs()
    out = torch.empty(numel, dtype=dtype)
    codecs.decode(bits, scales, out)
    signs = np.concatenate([s * reference.unpack(r, row * 8) for r, s in zip(bits.numpy(), scales.numpy())])
    want = torch.from_numpy(signs[:numel].astype(np.float32)).to(dtype)
    bits_type = torch.int32 if dtype == torch.float32 else torch.int16
    assert torch.equal(out.view(bits_type), want.view(bits_type))


@pytest.mark.parametrize("dtype", DTYPES)
@PROPERTY
@given(data=st.data(), rows=st.integers(1, 4), step=st.integers(0, 2**31), rank=st.integers(0, 7))
def test_randomized_encode_matches_the_reference(dtype: torch.dtype, data, rows: int, step: int, rank: int) -> None:
    x = data.draw(vectors(dtype))
    assume(x.numel() > 0)  # an empty call returns before any kernel
    length = padded_numel(x.numel(), rows)
    padded = reference.pad(x.float().numpy(), length)
    scales = codecs.row_absmax(x, rows, length)
    assert same(scales.numpy(), reference.absmax_rows(padded, rows))
    wire = torch.empty(rows, codecs.SCALE_BYTES + length // rows // 8, dtype=torch.uint8)
    key = stream_key(17, step, STAGES["inter"], rank)
    codecs.randomized_encode(x, scales, key, 0, wire)
    heads, bits = codecs.unframe(wire)
    assert torch.equal(heads, scales)
    assert np.array_equal(bits.numpy(), reference.binarize(padded, scales.numpy(), key, 0))
    keys = codecs.stream_keys([stream_key(17, step, STAGES["node"], rank), key], torch.empty(2, dtype=torch.int64))
    from_memory = torch.zeros_like(wire)
    codecs.randomized_encode(x, scales, keys[1:], 0, from_memory)
    assert torch.equal(from_memory, wire), "the key read from an int64 tensor of stream_keys"


def test_unframe_divides_a_copy_of_the_heads() -> None:
    """``codecs.unframe(rows, n)`` gives the heads' scales / n as ``divide_`` does, and leaves the rows alone, one
    row (whose heads numpy would not copy) or several."""
    rng = np.random.default_rng(3)
    for n, divisor in ((1, 7), (3, 3), (5, 1)):
        rows = torch.from_numpy(rng.integers(0, 256, (n, codecs.SCALE_BYTES + 6), dtype=np.uint8))
        rows[:, :codecs.SCALE_BYTES] = torch.from_numpy(rng.random(n, np.float32) * 9 + 0.1).view(torch.uint8).view(
            n, codecs.SCALE_BYTES)
        before = rows.clone()
        weights, signs = codecs.unframe(rows, divisor)
        expected = codecs.divide_(before[:, :codecs.SCALE_BYTES].flatten().clone().view(torch.float32), divisor)
        assert torch.equal(weights, expected) and torch.equal(rows, before)
        assert torch.equal(signs, rows[:, codecs.SCALE_BYTES:])
