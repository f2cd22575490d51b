"""Codec layer: wire framing and 16-bit decoding rounded exactly as torch rounds."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from compcoll import codecs, spec
from compcoll.kernels import cpu, reference
from compcoll.kernels.launch import COUNTS
from compcoll.spec import SCALES, STAGES, padded_numel, stream_key
from tests.kernels.cuda_sim_checks import tie_scales


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
    """Meta tensors have kernels (traced) where the communicator carries them only."""
    meta = torch.empty(1, device="meta")
    codecs.check_device(meta)
    with pytest.raises(ValueError, match="on meta are not supported by this communicator"):
        codecs.check_device(meta, carries_meta=False)


def test_a_device_sum_left_unread_makes_no_host_wait() -> None:
    """``compensated_sum(read=False)`` and ``compensated_sum(out=...)``: on meta tensors (the CUDA path, traced) the
    launches of a read sum without its wait, and None, ``host_value`` then the one wait; on the host the sum all the
    same, ``out`` holding it."""
    x, err = torch.empty(100003, device="meta"), torch.empty(100003, device="meta")
    total = torch.empty(1, dtype=torch.float64, device="meta")
    COUNTS.reset()
    assert codecs.compensated_sum(x, err, read=False) is None
    unread = (COUNTS.launches, COUNTS.waits)
    COUNTS.reset()
    assert codecs.compensated_sum(x, err, out=total) is None
    into = (COUNTS.launches, COUNTS.waits)
    codecs.host_value(total)
    into_read = (COUNTS.launches, COUNTS.waits)
    COUNTS.reset()
    codecs.compensated_sum(x, err)
    assert unread == into == (COUNTS.launches, 0) and into_read == (COUNTS.launches, 1) and COUNTS.waits == 1
    gen = torch.Generator().manual_seed(7)
    x, err = torch.randn(100003, generator=gen), torch.randn(100003, generator=gen)
    total = torch.empty(1, dtype=torch.float64)
    assert codecs.compensated_sum(x, err, "l1", out=total) is None
    assert codecs.compensated_sum(x, err, read=False) == codecs.compensated_sum(x, err) > 0
    assert codecs.host_value(total) == codecs.compensated_sum(x, err, "l1") > 0


def test_sumsq_matches_the_reference_order() -> None:
    for numel in (0, 1, 31, 8193, 100003):
        x = torch.randn(numel, generator=torch.Generator().manual_seed(numel))
        assert codecs.sumsq(x) == reference.sumsq(x.numpy())


def test_segment_sumsq_is_each_segments_sumsq_in_one_call() -> None:
    """The codec's sums equal ``sumsq`` of each segment alone (CPU), and on the CUDA path (meta tensors, counted)
    take two launches and no host wait, whatever the number of segments."""
    x = torch.randn(30011, generator=torch.Generator().manual_seed(3))
    for bounds in ((0, 30011), (0, 0, 5, 8200, 8200, 30000)):
        out = torch.empty(len(bounds) - 1, dtype=torch.float64)
        codecs.segment_sumsq(x, bounds, out)
        assert out.tolist() == [codecs.sumsq(x[lo:hi]) for lo, hi in zip(bounds[:-1], bounds[1:])]
        meta = torch.empty(30011, device="meta")
        before = (COUNTS.launches, COUNTS.waits)
        codecs.segment_sumsq(meta, bounds, torch.empty(len(bounds) - 1, dtype=torch.float64, device="meta"))
        assert (COUNTS.launches - before[0], COUNTS.waits - before[1]) == (2, 0)


# Property tests: the codec steps against the numpy reference on inputs hypothesis draws (random
# lengths on both sides of the serial/threaded switch, the three dtypes, signed zeros, subnormals,
# values near the dtype's limits). Every comparison is bit for bit; NaN (from inf - inf when an error
# buffer and an input both sit near the float32 limit) must appear in the same places.

FLOAT32_EDGES = (0.0, -0.0, 1e-45, -1e-45, 1.1754942e-38, 1.1754944e-38, -1.1754944e-38, 3.4028235e38, -3.4028235e38)
DTYPES = (torch.float32, torch.float16, torch.bfloat16)
PROPERTY = settings(max_examples=80, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])


@st.composite
def vectors(draw, dtype: torch.dtype, numel: int | None = None) -> torch.Tensor:
    """A vector of ``dtype``: random normals at a drawn magnitude, some elements replaced by edge values."""
    if numel is None:
        numel = draw(st.one_of(st.integers(0, 300), st.integers(301, 20000),
                               st.integers(cpu.SERIAL_BELOW - 8, cpu.SERIAL_BELOW + 9000)))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    magnitude = draw(st.sampled_from([1e-44, 1e-39, 1e-30, 1e-3, 1.0, 1e4, 1e30, 1e38]))
    limit = float(torch.finfo(dtype).max)
    x = np.clip(rng.standard_normal(numel) * magnitude, -limit, limit).astype(np.float32)
    edits = draw(st.lists(st.tuples(st.integers(0, max(numel - 1, 0)),
                                    st.one_of(st.sampled_from(FLOAT32_EDGES), st.floats(width=32, allow_nan=False,
                                                                                         allow_infinity=False))),
                          max_size=12 if numel else 0))
    for index, value in edits:
        x[index] = value
    return torch.from_numpy(np.clip(x, -limit, limit)).to(dtype)


def _same(got: np.ndarray, want: np.ndarray) -> bool:
    """Equal bits, with NaN at the same places (any payload)."""
    got_nan, want_nan = np.isnan(got), np.isnan(want)
    bits = np.uint16 if got.dtype.itemsize == 2 else np.uint32
    return np.array_equal(got_nan, want_nan) and np.array_equal(got[~got_nan].view(bits), want[~want_nan].view(bits))


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
    assert _same(np.float64(total), np.float64(want_total))
    assert _same(np.float32(value), want_scale)
    assert np.array_equal(bits.numpy(), want_bits) and _same(work.numpy(), want_error)
    held, held_bits = error.clone(), torch.empty_like(bits)  # the scale held in a tensor, as a device-resident one
    codecs.compensate_encode(x, held, torch.tensor([value], dtype=torch.float32), held_bits)
    assert torch.equal(held_bits, bits) and _same(held.numpy(), work.numpy())


@pytest.mark.parametrize("scale", list(SCALES))
@PROPERTY
@given(data=st.data(), ranks=st.integers(1, 4), with_base=st.booleans())
def test_accumulate_signs_matches_the_reference(scale: str, data, ranks: int, with_base: bool) -> None:
    base = data.draw(vectors(torch.float32))
    numel = base.numel()
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1)))
    bits = torch.from_numpy(rng.integers(0, 256, (ranks, -(-numel // 8)), dtype=np.uint8))
    scales = data.draw(vectors(torch.float32, ranks)).abs().numpy()
    weights = torch.from_numpy((scales / np.float32(ranks)).astype(np.float32))
    with np.errstate(over="ignore", invalid="ignore"):  # sums near the float32 limit overflow, as in the kernel
        want = reference.average_signs(list(bits.numpy()), list(scales), numel)
        if with_base:
            want = (want + base.numpy()).astype(np.float32)
    for read in (True, False):  # not read: left on a CUDA device; a float on the CPU either way
        out = base.clone() if with_base else torch.empty(numel)
        total = codecs.accumulate_signs(bits, weights, out if with_base else None, out, numel, scale, read)
        assert isinstance(total, float)
        assert _same(out.numpy(), want)
        assert _same(np.float64(total), np.float64(reference.power_sum(want, SCALES[scale])))


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
    assert _same(scales.numpy(), reference.absmax_rows(padded, rows))
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


def test_results_go_into_out_where_given() -> None:
    """The codecs whose results live across codec calls write them into ``out`` where given (a plan's workspace:
    no allocation a call), the same bits as the tensors they make otherwise, on fresh random inputs of a length
    that is a multiple of nothing; ``out`` may be a slice of a larger buffer, as ``Workspace.get`` hands out."""
    rng = np.random.default_rng(29)
    length, rows, block = 1000, 4, 37
    source = torch.from_numpy(rng.standard_normal(997).astype(np.float32))
    error = torch.from_numpy(rng.standard_normal(length).astype(np.float32))
    blocks = rows * -(-(length // rows) // block)
    wire = torch.from_numpy(rng.integers(0, 256, (rows, codecs.SCALE_BYTES + blocks // rows + 31), dtype=np.uint8))
    wire[:, :codecs.SCALE_BYTES] = torch.from_numpy(rng.random(rows, np.float32) + 0.5).view(torch.uint8).view(
        rows, codecs.SCALE_BYTES)

    def spare(numel: int, dtype: torch.dtype) -> torch.Tensor:
        return torch.full((numel + 5,), float("nan"), dtype=dtype)[:numel]

    sums = codecs.block_sums(source, error, block, "l2", rows)
    cases = [
        (lambda out=None: codecs.row_absmax(source, rows, length, out), spare(rows, torch.float32)),
        (lambda out=None: codecs.unframe(wire.clone(), rows, out)[0], spare(rows, torch.float32)),
        (lambda out=None: codecs.block_sums(source, error, block, "l1", rows, out), spare(blocks, torch.float64)),
        (lambda out=None: codecs.block_absmax(source, error, block, rows, out), spare(blocks, torch.float32)),
        (lambda out=None: codecs.frame_scales(wire.clone(), sums, "l2", block, length // rows, out)[0].reshape(-1),
         spare(blocks, torch.float32)),
        (lambda out=None: codecs.unframe_blocks(wire, blocks // rows, rows, out)[0].reshape(-1),
         spare(blocks, torch.float32)),
    ]
    for run, out in cases:
        made, written = run(), run(out)
        assert written.data_ptr() == out.data_ptr() and torch.equal(out, made)


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
