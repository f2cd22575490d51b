"""CUDA kernels against the CPU kernels, bit for bit; run in a process with NUMBA_ENABLE_CUDASIM=1 (or on a GPU)."""

from __future__ import annotations

import argparse
import itertools
import sys
from typing import Callable

import numpy as np
import torch
from numba import config
from numba import cuda as numba_cuda

from compcoll import codecs, spec
from compcoll.kernels import cpu, cuda, launch, reference
from compcoll.kernels.arrays import DeviceArray
from compcoll.kernels.launch import COUNTS
from compcoll.spec import SCALES
from tests.kernels import simulator


def _source(numel: int, dtype: torch.dtype, seed: int) -> tuple[np.ndarray, np.ndarray | None, np.ndarray]:
    """(kernel source, lookup table or None, its exact float32 values); a few zeros and ties."""
    x = torch.randn(numel, generator=torch.Generator().manual_seed(seed)) * 3
    x[::13] = 0.0
    x = x.to(dtype)
    if dtype == torch.float32:
        return x.numpy(), None, x.numpy()
    return x.view(torch.int16).numpy().view(np.uint16), codecs.dispatch.lookup_table(dtype), x.float().numpy()


_SPECIAL_SCALES = np.array([65519.0, 65520.0, 1e-6, 2.0 ** -25, 1e-40, -0.0, 1 + 2.0 ** -8, 3.0e38], np.float32)
"""Scales whose rounding to float16 / bfloat16 is an edge: float16's largest rounded down, and up to infinity, its
subnormals and a tie to zero, a float32 subnormal, negative zero, a bfloat16 tie, float16's overflow."""


def check_row_maxima(src: np.ndarray, lut: np.ndarray | None, numel: int, world: int) -> np.ndarray:
    """``row_absmax`` (one launch) against the CPU kernel on ``src`` cut into ``world`` rows, and on copies of it with
    a NaN in row 0, at the start of row 1 (which row 0's lanes must not read) and in the last row (which the last
    block to finish reduces after the others), its finite flag each time (src again at the end: the flag's count
    was zeroed for the stream's next launch); returns the maxima of ``src``."""
    full = reference.padded_numel(numel, world)
    row_len = full // world
    d_lut = None if lut is None else numba_cuda.to_device(lut)
    poisoned, next_row, last_row = src.copy(), src.copy(), src.copy()
    if numel > 5 and lut is None:
        poisoned[5] = np.nan
    if row_len < numel and lut is None:
        next_row[row_len] = np.nan
        last_row[numel - 1] = -np.inf
    for source in (src, poisoned, next_row, last_row, src):
        maxima = np.empty(world, np.float32)
        cpu.row_absmax(source, lut, numel, row_len, maxima)
        d_max = numba_cuda.device_array(world, np.float32)
        flag = numba_cuda.to_device(np.full(1, 7.0))
        COUNTS.reset()
        cuda.row_absmax(numba_cuda.to_device(source), d_lut, numel, row_len, d_max, finite=flag)
        assert COUNTS.launches == 1, ("row_absmax's launches", COUNTS.launches)
        assert np.array_equal(d_max.copy_to_host(), maxima, equal_nan=True), "row_absmax"
        found = flag.copy_to_host()[0]
        assert found == 0.0 if np.isfinite(maxima).all() else np.isnan(found), ("row_absmax's finite flag", found)
    return maxima


def check(numel: int, world: int, dtype: torch.dtype) -> None:
    src, lut, values = _source(numel, dtype, numel + world)
    full = reference.padded_numel(numel, world)
    rng = np.random.default_rng(numel)
    err = (rng.standard_normal(full) * 0.3).astype(np.float32)
    d_src, d_lut = numba_cuda.to_device(src), None if lut is None else numba_cuda.to_device(lut)

    for power in (1, 2):
        total = cpu.compensated_power_sum(src, lut, err, numel, power)
        COUNTS.reset()
        assert cuda.compensated_power_sum(d_src, d_lut, numba_cuda.to_device(err), numel, power) == total, power
        assert (COUNTS.launches, COUNTS.waits) == (1, 1), (full, COUNTS)
    slot, held = numba_cuda.device_array(1, np.float64), numba_cuda.device_array(1, np.float32)
    COUNTS.reset()
    cuda.compensated_power_sum(d_src, d_lut, numba_cuda.to_device(err), numel, 2, into=slot, scale=(full, 2, held))
    assert (COUNTS.launches, COUNTS.waits) == (1, 0), (full, COUNTS)
    assert slot.copy_to_host()[0] == total, "sum of squares into a device slot"
    assert held.copy_to_host()[0].tobytes() == spec.scale_from(total, full, "l2").tobytes(), "the scale beside it"
    scale = np.float32(np.sqrt(total) / np.sqrt(full))
    cpu_err, cpu_bits = err.copy(), np.empty(full // 8, np.uint8)
    cpu.compensate_encode(src, lut, cpu_err, numel, scale, cpu_bits)
    d_err, d_bits = numba_cuda.to_device(err), numba_cuda.device_array(full // 8, np.uint8)
    held = scale if world == 1 else numba_cuda.to_device(np.array([scale], np.float32))  # a number, or in device memory
    cuda.compensate_encode(d_src, d_lut, d_err, numel, held, d_bits)
    assert np.array_equal(d_bits.copy_to_host(), cpu_bits), "encoded bits"
    assert np.array_equal(d_err.copy_to_host(), cpu_err), "worker error"
    check_agreed_encode(src, lut, err, numel, world, total, rng)

    rows = cpu_bits.reshape(world, -1)
    weights = (rng.random(world) + 0.5).astype(np.float32)
    chunk = full // world
    for power, base in ((2, None), (1, None), (2, (rng.standard_normal(chunk) * 0.1).astype(np.float32))):
        out = np.empty(chunk, np.float32)
        want = cpu.accumulate_signs(rows[:, :chunk // 8].copy(), weights, base, out, chunk, power)
        d_out = numba_cuda.device_array(chunk, np.float32)
        slot = None if base is None else numba_cuda.device_array(1, np.float64)  # the sum kept on the device
        held = None if base is None else numba_cuda.device_array(1, np.float32)  # with its scale beside it
        got = cuda.accumulate_signs(numba_cuda.to_device(rows[:, :chunk // 8].copy()), numba_cuda.to_device(weights),
                                    None if base is None else numba_cuda.to_device(base), d_out, chunk, power,
                                    into=slot, scale=None if base is None else (chunk, power, held))
        got = got if slot is None else slot.copy_to_host()[0]
        assert got == want and np.array_equal(d_out.copy_to_host(), out), "accumulate_signs"
        if held is not None:
            assert held.copy_to_host()[0].tobytes() == spec.scale_from(want, chunk, "l2").tobytes(), "its scale"

    positive, negative = weights, -weights
    out = np.empty(numel, np.float32)
    cpu.select_decode(rows, positive, negative, out, numel)
    d_out = numba_cuda.device_array(numel, np.float32)
    cuda.select_decode(numba_cuda.to_device(rows), numba_cuda.to_device(positive), numba_cuda.to_device(negative),
                       d_out, numel)
    assert np.array_equal(d_out.copy_to_host(), out), "select_decode"
    groups = np.concatenate([rows, rows[:, ::-1]])  # 2 groups of world rows, into 2 segments of a chunk, cut short
    group_weights = np.stack([weights, weights[::-1] * np.float32(3)])
    count = min(numel, 2 * chunk - 3)
    out = np.empty(count, np.float32)
    cpu.accumulate_groups(groups, group_weights, out, count)
    d_out = numba_cuda.device_array(count, np.float32)
    cuda.accumulate_groups(numba_cuda.to_device(groups), numba_cuda.to_device(group_weights), d_out, count)
    assert np.array_equal(d_out.copy_to_host(), out), "accumulate_groups"
    sums = (rng.standard_normal((world + 1, numel)) * 10.0 ** rng.integers(-3, 4, (world + 1, numel))).astype(
        np.float32)
    averaged = np.empty(numel, np.float32)
    cpu.average_rows(sums, averaged)
    d_averaged = numba_cuda.device_array(numel, np.float32)
    cuda.average_rows(numba_cuda.to_device(sums), d_averaged)
    assert np.array_equal(d_averaged.copy_to_host(), averaged), "average_rows"
    for k, (kind, raw) in enumerate((("float32", np.uint32), ("float16", np.uint16), ("bfloat16", np.uint16))):
        heads = weights.copy()
        heads[-1] = _SPECIAL_SCALES[(numel + world + k) % len(_SPECIAL_SCALES)]
        framed = np.concatenate([heads.view(np.uint8).reshape(world, codecs.SCALE_BYTES), rows], axis=1)
        rounded = torch.from_numpy(heads).to(getattr(torch, kind))  # torch rounds, as the CPU path's decode
        positive, negative = (v.view(torch.int32 if kind == "float32" else torch.int16).numpy().view(raw)
                              for v in (rounded, (-torch.from_numpy(heads)).to(rounded.dtype)))
        out = np.empty(numel, raw)
        cpu.select_decode(rows, positive, negative, out, numel)
        d_bits = numba_cuda.device_array(numel, raw)
        cuda.decode_framed(numba_cuda.to_device(framed), d_bits, numel, kind)
        assert np.array_equal(d_bits.copy_to_host(), out), f"decode_framed to {kind}, scale {heads[-1]!r}"
        for divisor, base in ((1, None), (3, (rng.standard_normal(chunk) * 0.1).astype(np.float32))):
            out = np.empty(chunk, np.float32)  # the frames' weights: their heads' scales / divisor
            cpu.accumulate_signs(rows, heads / np.float32(divisor), base, out, chunk, 2)
            d_out = numba_cuda.device_array(chunk, np.float32)
            COUNTS.reset()
            d_framed = numba_cuda.to_device(framed)
            cuda.accumulate_frames(d_framed[:, codecs.SCALE_BYTES:], d_framed, divisor,
                                   None if base is None else numba_cuda.to_device(base), d_out, chunk)
            assert COUNTS.launches == 1 and np.array_equal(d_out.copy_to_host().view(np.uint32), out.view(np.uint32)), (
                "accumulate_frames", heads[-1], divisor)

    maxima = check_row_maxima(src, lut, numel, world)

    key = reference.stream_key(7, 3, reference.STAGES["inter"], 1)
    width = codecs.SCALE_BYTES + chunk // 8
    framed = np.zeros((world, width), np.uint8)
    cpu.randomized_encode(src, lut, numel, maxima, np.uint64(key), 11, framed)
    assert np.array_equal(framed[:, :codecs.SCALE_BYTES].copy().view(np.float32).reshape(-1), maxima,
                          equal_nan=True), "randomized_encode's heads"
    d_framed = numba_cuda.to_device(np.zeros((world, width), np.uint8))
    d_key = numba_cuda.to_device(np.array([key], np.uint64))
    cuda.randomized_encode(d_src, d_lut, numel, numba_cuda.to_device(maxima), d_key, 11, d_framed)
    assert np.array_equal(d_framed.copy_to_host(), framed), "randomized_encode"
    padded = np.zeros(full, np.float32)
    padded[:numel] = values
    assert np.array_equal(framed[:, codecs.SCALE_BYTES:].reshape(-1),
                          reference.binarize(padded, maxima, key, 11).reshape(-1)), "randomized vs reference"


def check_agreed_encode(src: np.ndarray, lut: np.ndarray | None, err: np.ndarray, numel: int, world: int,
                        total: float, rng: np.random.Generator) -> None:
    """``compensate_encode_agreed``: the encode by the last rank's scale and the weights s_i / divisor of senders in
    the rank order and in a transpose of it (even ranks, then odd: the hierarchical allgather form's order at 2 ranks
    a node; the divisor the nodes), from sums in a gathered round's table (every record's third field) and in a
    summed round's (one after another), both scales: the CPU encode's bits and error, and ``spec.scales_from``'s
    scales divided in float32."""
    full, rank = err.size, world - 1
    table = rng.random(3 * (world + 1)) * 10.0 ** rng.integers(-20, 20, 3 * (world + 1))
    transposed = sorted(range(world), key=lambda r: (r % 2, r))
    for first, step in ((3 + 2, 3), (1, 1)):
        table[first + rank * step] = total
        values = {name: spec.scales_from(table[first::step][:world], full, name) for name in ("l2", "l1")}
        for (power, name), (senders, divisor) in itertools.product(
                ((2, "l2"), (1, "l1")), ((list(range(world)), world), (transposed, max(world // 2, 1)))):
            cpu_err, cpu_bits = err.copy(), np.empty(full // 8, np.uint8)
            cpu.compensate_encode(src, lut, cpu_err, numel, values[name][rank], cpu_bits)
            d_err, d_bits = numba_cuda.to_device(err), numba_cuda.device_array(full // 8, np.uint8)
            d_weights = numba_cuda.device_array(len(senders), np.float32)
            cuda.compensate_encode_agreed(numba_cuda.to_device(src), None if lut is None else numba_cuda.to_device(lut),
                                          d_err, numel, numba_cuda.to_device(table), first, step, rank,
                                          numba_cuda.to_device(np.array(senders, np.int32)), full, power, divisor,
                                          d_weights, d_bits)
            where = ("compensate_encode_agreed", first, step, name, senders)
            assert np.array_equal(d_bits.copy_to_host(), cpu_bits), (*where, "bits")
            assert np.array_equal(d_err.copy_to_host(), cpu_err), (*where, "error")
            expected = values[name][senders] / np.float32(divisor)
            assert d_weights.copy_to_host().tobytes() == expected.tobytes(), (*where, "weights")


def check_blocks(numel: int, world: int, dtype: torch.dtype, block: int) -> None:
    """The block-scale kernels (one scale per ``block`` elements): CUDA = CPU = reference, strided wire rows."""
    src, lut, values = _source(numel, dtype, numel + block)
    full = spec.padded_numel(numel, world)
    chunk = full // world
    blocks = -(-chunk // block)
    rng = np.random.default_rng(numel + world)
    err = (rng.standard_normal(full) * 0.3).astype(np.float32)
    d_src, d_lut = numba_cuda.to_device(src), None if lut is None else numba_cuda.to_device(lut)
    padded = np.zeros(full, np.float32)
    padded[:numel] = values
    for power in (1, 2):
        sums = np.empty(world * blocks, np.float64)
        cpu.block_power_sums(src, lut, err, numel, block, chunk, power, sums)
        assert np.array_equal(sums, reference.block_sums(padded + err, block, power, world)), ("cpu block sums", power)
        d_sums = numba_cuda.device_array(world * blocks, np.float64)
        cuda.block_power_sums(d_src, d_lut, numba_cuda.to_device(err), numel, block, chunk, power, d_sums)
        assert np.array_equal(d_sums.copy_to_host(), sums), ("block sums", power)
        _check_finite_flag(lambda e, flag: cuda.block_power_sums(d_src, d_lut, e, numel, block, chunk, power,
                                                                 d_sums, finite=flag), err, ("block sums", power))
        _check_codes(sums, block, chunk, power, world, rng)
    _check_codes(rng.random(world * blocks).astype(np.float32), block, chunk, 0, world, rng)
    for bits in (2, 3, 8):  # the level steps of block maxima
        _check_codes((rng.random(world * blocks) * 5.0).astype(np.float32), block, chunk, -bits, world, rng)
    want_bits, scales, want_err = reference.compress_blocks(padded, err, block, "l2", world)
    heads = codecs.SCALE_BYTES * blocks
    framed = np.zeros((world, heads + chunk // 8), np.uint8)
    cpu_err = err.copy()
    cpu.encode_blocks(src, lut, cpu_err, numel, scales, block, framed[:, heads:])
    assert np.array_equal(framed[:, heads:].reshape(-1), want_bits) and np.array_equal(cpu_err, want_err), "cpu encode"
    d_framed, d_err = numba_cuda.to_device(np.zeros_like(framed)), numba_cuda.to_device(err)
    cuda.encode_blocks(d_src, d_lut, d_err, numel, numba_cuda.to_device(scales), block, d_framed[:, heads:])
    assert np.array_equal(d_framed.copy_to_host(), framed) and np.array_equal(d_err.copy_to_host(), cpu_err), "encode"

    weights = (rng.random((world, blocks)) + 0.5).astype(np.float32)
    rows = framed[:, heads:]
    for base in (None, (rng.standard_normal(chunk) * 0.1).astype(np.float32)):
        out = np.empty(chunk, np.float32)
        cpu.accumulate_blocks(rows, weights, block, base, out, chunk)
        want = np.zeros(chunk, np.float32)
        for r in range(world):  # rank by rank in float32, as reference.average_block_signs
            lengths = reference.block_lengths(chunk, block)
            want = (want + np.repeat(weights[r], lengths) * reference.unpack(rows[r].copy(), chunk)).astype(np.float32)
        assert np.array_equal(out, want if base is None else (want + base).astype(np.float32)), "cpu accumulate"
        d_out = numba_cuda.device_array(chunk, np.float32)
        cuda.accumulate_blocks(numba_cuda.to_device(framed)[:, heads:], numba_cuda.to_device(weights), block,
                               None if base is None else numba_cuda.to_device(base), d_out, chunk)
        assert np.array_equal(d_out.copy_to_host(), out), "accumulate_blocks"

    out = np.empty(numel, np.float32)
    cpu.decode_blocks(rows, weights.view(np.uint32), block, np.uint32(1 << 31), out.view(np.uint32), numel)
    lengths = np.tile(reference.block_lengths(chunk, block), world)
    want = (np.repeat(weights.reshape(-1), lengths) * reference.unpack(rows.reshape(-1), full))[:numel]
    assert np.array_equal(out, want), "cpu decode"

    wire = np.zeros((world, codecs.SCALE_BYTES + blocks + chunk // 8), np.uint8)  # coded scales, then the signs
    coded = np.empty((world, blocks), np.float32)
    cpu.code_blocks(scales, block, chunk, 0, spec.SCALE_STEPS, wire, coded)
    wire[:, codecs.SCALE_BYTES + blocks:] = rows
    for kind, raw in (("float32", np.uint32), ("float16", np.uint16), ("bfloat16", np.uint16)):
        rounded = torch.from_numpy(coded).to(getattr(torch, kind))  # the scales as torch rounds them
        rounded = rounded.view(torch.int32 if raw is np.uint32 else torch.int16).numpy().view(raw)
        sign = raw(1 << (8 * np.dtype(raw).itemsize - 1))
        out = np.empty(numel, raw)
        cpu.decode_blocks(rows, rounded, block, sign, out, numel)
        d_out = numba_cuda.device_array(numel, raw)
        cuda.decode_framed_blocks(numba_cuda.to_device(wire), numba_cuda.to_device(spec.SCALE_STEPS), blocks, block,
                                  d_out, numel, kind)
        assert np.array_equal(d_out.copy_to_host(), out), ("decode_framed_blocks", kind)
    base = (rng.standard_normal(chunk) * 0.1).astype(np.float32)
    _check_framed_accumulate(wire, blocks, block, 1, chunk - 3, (None, base[:chunk - 3]))


def _check_framed_accumulate(wire: np.ndarray, per_row: int, block: int, bits: int, count: int, bases: tuple) -> None:
    """``accumulate_framed_blocks`` (1 bit) / ``accumulate_framed_levels`` on coded wire rows, each base of ``bases``
    (1 bit) and divisors 1 and 3: CUDA = the CPU's ``decode_codes`` then ``accumulate_blocks`` / ``_levels``, in one
    launch."""
    world = wire.shape[0]
    payload = wire[:, codecs.SCALE_BYTES + per_row:]
    d_wire, d_steps = numba_cuda.to_device(wire), numba_cuda.to_device(spec.SCALE_STEPS)
    for divisor in (1, 3):
        weights = np.empty((world, per_row), np.float32)
        cpu.decode_codes(wire, spec.SCALE_STEPS, divisor, weights)
        for base in bases:
            out, d_out = np.empty(count, np.float32), numba_cuda.device_array(count, np.float32)
            COUNTS.reset()
            if bits == 1:
                cpu.accumulate_blocks(payload, weights, block, base, out, count)
                cuda.accumulate_framed_blocks(d_wire[:, codecs.SCALE_BYTES + per_row:], d_wire, d_steps, divisor,
                                              block, None if base is None else numba_cuda.to_device(base), d_out,
                                              count)
            else:
                cpu.accumulate_levels(payload, weights, block, bits, out, count)
                cuda.accumulate_framed_levels(d_wire[:, codecs.SCALE_BYTES + per_row:], d_wire, d_steps, divisor,
                                              block, bits, d_out, count)
            assert COUNTS.launches == 1, ("a framed accumulate's launches", COUNTS.launches)
            assert np.array_equal(d_out.copy_to_host(), out), ("framed accumulate", bits, divisor, base is None)


def tie_scales() -> np.ndarray:
    """1.0 and the float32 scales exactly halfway between two of its row's neighbouring values (a tie in float64:
    the larger value's code wins)."""
    values = (np.float64(1.0) * spec.SCALE_STEPS).astype(np.float32).astype(np.float64)
    mids = ((values[:-2] + values[1:-1]) / 2).astype(np.float32)
    ties = mids[values[:-2] - mids == mids - values[1:-1]]
    assert ties.size > 50, ties.size
    return np.concatenate([[1.0], ties]).astype(np.float32)


def _check_codes(src: np.ndarray, block: int, row_len: int, power: int, world: int, rng: np.random.Generator
                 ) -> None:
    """``code_blocks`` (from float64 sums of |x|^``power``, 2 and 1, float32 scales, 0, or the level steps of
    float32 block maxima, -bits) and ``decode_codes``: CUDA = CPU = ``spec.code_scales``, into wire rows with bytes
    behind the codes; a zero scale (code 255) among them."""
    m = src.size // world
    src = src.copy()
    src[m // 2] = 0.0
    if not power:  # scales below 1.0, and then 1.0 and scales halfway between two of its row's values (ties)
        ties = tie_scales()[:m]
        src[:ties.size] = ties
    if power > 0:
        scales = spec.block_scales_from(src, np.tile(spec.block_lengths(row_len, block), world),
                                        {2: "l2", 1: "l1"}[power]).reshape(world, m)
    elif power < 0:
        scales = spec.level_step(src, -power).reshape(world, m)
    else:
        scales = src.reshape(world, m)
    refs, codes, decoded = spec.code_scales(scales)
    wire = rng.integers(0, 256, (world, codecs.SCALE_BYTES + m + 3), dtype=np.uint8)
    want = wire.copy()
    want[:, :codecs.SCALE_BYTES] = refs.view(np.uint8).reshape(world, codecs.SCALE_BYTES)
    want[:, codecs.SCALE_BYTES:codecs.SCALE_BYTES + m] = codes
    rows, got = wire.copy(), np.empty((world, m), np.float32)
    cpu.code_blocks(src, block, row_len, power, spec.SCALE_STEPS, rows, got)
    assert np.array_equal(rows, want) and np.array_equal(got, decoded), ("cpu code_blocks", power)
    d_rows, d_got = numba_cuda.to_device(wire), numba_cuda.device_array((world, m), np.float32)
    d_steps = numba_cuda.to_device(spec.SCALE_STEPS)
    cuda.code_blocks(numba_cuda.to_device(src), block, row_len, power, d_steps, d_rows, d_got)
    assert np.array_equal(d_rows.copy_to_host(), want) and np.array_equal(d_got.copy_to_host(), decoded), (
        "code_blocks", power)
    for divisor in (1, world + 2):
        weights = np.empty((world, m), np.float32)
        cpu.decode_codes(want, spec.SCALE_STEPS, divisor, weights)
        assert np.array_equal(weights, decoded / np.float32(divisor)), ("cpu decode_codes", divisor)
        back = numba_cuda.device_array((world, m), np.float32)
        cuda.decode_codes(d_rows, d_steps, divisor, back)
        assert np.array_equal(back.copy_to_host(), weights), ("decode_codes", power, divisor)


def _check_finite_flag(fold: Callable[[object, object], None], err: np.ndarray, name: object) -> None:
    """A block fold's finite flag (``kernels.cuda.blocks._staged_fold``, step 4), ``fold(err, flag)`` a launch of
    it: 0.0 on ``err``, NaN with an Inf in its last element and then a NaN in its first (one thread block's, and
    another's where the grid has several), and 0.0 on ``err`` again (the grid's flag was zeroed for the next
    launch)."""
    found = []
    for planted in ((), ((-1, np.inf),), ((0, np.nan),), ()):
        e = err.copy()
        for i, value in planted:
            e[i] = value
        flag = numba_cuda.to_device(np.full(1, 7.0))
        fold(numba_cuda.to_device(e), flag)
        found.append(flag.copy_to_host()[0])
    assert found[0] == 0.0 and np.isnan(found[1]) and np.isnan(found[2]) and found[3] == 0.0, (name, found)


def check_levels(numel: int, world: int, dtype: torch.dtype, block: int, bits: int) -> None:
    """The level kernels (``bits`` per element, one step per ``block``): CUDA = CPU = reference, strided wire rows."""
    src, lut, values = _source(numel, dtype, numel + bits)
    row = -(-numel // world // 8) * 8
    full = world * row
    blocks = -(-row // block)
    rng = np.random.default_rng(numel + world + bits)
    err = (rng.standard_normal(full) * 0.3).astype(np.float32)
    d_src, d_lut = numba_cuda.to_device(src), None if lut is None else numba_cuda.to_device(lut)
    padded = np.zeros(full, np.float32)
    padded[:numel] = values
    top = np.empty(world * blocks, np.float32)
    cpu.block_absmax(src, lut, err, numel, block, row, top)
    assert np.array_equal(top, reference.block_absmax(padded + err, block, world)), "cpu block max"
    d_top = numba_cuda.device_array(world * blocks, np.float32)
    cuda.block_absmax(d_src, d_lut, numba_cuda.to_device(err), numel, block, row, d_top)
    assert np.array_equal(d_top.copy_to_host(), top), "block_absmax"
    _check_finite_flag(lambda e, flag: cuda.block_absmax(d_src, d_lut, e, numel, block, row, d_top, finite=flag),
                       err, "block_absmax")
    want_planes, steps, want_err = reference.compress_levels(padded, err, block, bits, world)
    heads = codecs.SCALE_BYTES + blocks
    framed = np.zeros((world, heads + bits * row // 8), np.uint8)
    cpu_err = err.copy()
    cpu.encode_levels(src, lut, cpu_err, numel, steps, block, bits, framed[:, heads:])
    assert np.array_equal(framed[:, heads:], want_planes) and np.array_equal(cpu_err, want_err), "cpu levels"
    d_framed, d_err = numba_cuda.to_device(np.zeros_like(framed)), numba_cuda.to_device(err)
    cuda.encode_levels(d_src, d_lut, d_err, numel, numba_cuda.to_device(steps), block, bits, d_framed[:, heads:])
    assert np.array_equal(d_framed.copy_to_host(), framed), "encode_levels planes"
    assert np.array_equal(d_err.copy_to_host(), cpu_err), "encode_levels error"
    weights = (rng.random((world, blocks)) + 0.5).astype(np.float32)
    out = np.empty(row - 3, np.float32)
    cpu.accumulate_levels(framed[:, heads:], weights, block, bits, out, out.size)
    d_out = numba_cuda.device_array(out.size, np.float32)
    cuda.accumulate_levels(numba_cuda.to_device(framed)[:, heads:], numba_cuda.to_device(weights), block, bits, d_out,
                           out.size)
    assert np.array_equal(d_out.copy_to_host(), out), "accumulate_levels"
    wire = np.zeros_like(framed)  # the steps coded into the heads, as a served row carries them
    cpu.code_blocks(weights.reshape(-1), block, row, 0, spec.SCALE_STEPS, wire, np.empty_like(weights))
    wire[:, heads:] = framed[:, heads:]
    _check_framed_accumulate(wire, blocks, block, bits, row - 3, (None,))
    weights[-1, 0] = 0.0  # a negative level over a zero step: +0, as accumulating from 0
    out = np.empty(full - 5, np.float32)
    cpu.decode_levels(framed[:, heads:], weights, block, bits, out, out.size)
    d_out = numba_cuda.device_array(out.size, np.float32)
    cuda.decode_levels(numba_cuda.to_device(framed)[:, heads:], numba_cuda.to_device(weights), block, bits, d_out,
                       out.size)
    assert np.array_equal(d_out.copy_to_host().view(np.uint32), out.view(np.uint32)), "decode_levels"


def check_tree_sum() -> None:
    """The device pairwise tree adds like the reference's, within one block and across the collapse to it, in one
    launch; the scale it can write beside the sum has ``spec.scale_from``'s bits."""
    rng = np.random.default_rng(3)
    kept = cuda.sums.COLLAPSED
    try:  # narrower than on a GPU (the simulator runs a Python thread per value): 16 gives 512 values a thread
        for cuda.sums.COLLAPSED in (1024, 16):
            _check_tree_sums(rng)
    finally:
        cuda.sums.COLLAPSED = kept


def _check_tree_sums(rng: np.random.Generator) -> None:
    for size in (1, 2, 3, 5, 100, 1023, 2049, 4097):
        values = rng.standard_normal(size) * 10.0 ** rng.integers(-8, 8, size)
        values[::7] = -0.0
        COUNTS.reset()
        assert cuda.tree_sum(numba_cuda.to_device(values)) == reference.tree_sum(values), f"tree_sum of {size}"
        assert (COUNTS.launches, COUNTS.waits) == (1, 1), (size, COUNTS)
        slots = numba_cuda.to_device(np.full(3, np.nan))
        scale = numba_cuda.to_device(np.full(2, np.nan, np.float32))
        COUNTS.reset()
        assert cuda.tree_sum(numba_cuda.to_device(values), into=slots[1:2], scale=(size, 1, scale[1:])) is None
        assert (COUNTS.launches, COUNTS.waits) == (1, 0), (size, COUNTS)
        assert slots.copy_to_host()[1] == reference.tree_sum(values), f"tree_sum of {size} into a device slot"
        want = spec.scale_from(reference.tree_sum(values), size, "l1")
        assert scale.copy_to_host()[1].tobytes() == want.tobytes(), f"the l1 scale beside the tree of {size}"


def check_lane_sums(lengths: tuple[int, ...] = (8200, 20011), dtypes: tuple[torch.dtype, ...] = (torch.float32,
                    torch.bfloat16), powers: tuple[int, ...] = (1, 2)) -> None:
    """The lane sums' order, on inputs whose float64 sums depend on it (magnitudes 2^-20 to 2^20; randn times 3
    mostly sums exactly in any order at these lengths): the sums of |x|^p, float32 and bfloat16 (a table), and the
    accumulated signs' sums and values, equal the CPU kernels' past one summation block and a batch's end."""
    rng = np.random.default_rng(11)
    for numel in lengths:
        x = torch.from_numpy((rng.standard_normal(numel) * np.exp2(rng.integers(-20, 21, numel))).astype(np.float32))
        err = (rng.standard_normal(numel) * 1e-3).astype(np.float32)
        for dtype in dtypes:
            src = x.numpy() if dtype == torch.float32 else x.to(dtype).view(torch.int16).numpy().view(np.uint16)
            lut = None if dtype == torch.float32 else codecs.dispatch.lookup_table(dtype)
            d_lut = None if lut is None else numba_cuda.to_device(lut)
            for power in powers:
                want = cpu.compensated_power_sum(src, lut, err, numel - 5, power)
                got = cuda.compensated_power_sum(numba_cuda.to_device(src), d_lut, numba_cuda.to_device(err),
                                                 numel - 5, power)
                assert got == want, ("the lane sums' order", numel, dtype, power)
        rows = rng.integers(0, 256, (3, -(-numel // 8)), dtype=np.uint8)
        weights = (rng.standard_normal(3) * np.exp2(rng.integers(-20, 21, 3))).astype(np.float32)
        base = (rng.standard_normal(numel) * np.exp2(rng.integers(-20, 21, numel))).astype(np.float32)
        for power in powers:
            out, d_out = np.empty(numel, np.float32), numba_cuda.device_array(numel, np.float32)
            want = cpu.accumulate_signs(rows, weights, base, out, numel, power)
            got = cuda.accumulate_signs(numba_cuda.to_device(rows), numba_cuda.to_device(weights),
                                        numba_cuda.to_device(base), d_out, numel, power)
            assert got == want and np.array_equal(d_out.copy_to_host(), out), ("accumulated lanes' order", power)


def check_many_ranks(numel: int = 20011, ranks: tuple[int, ...] = (9, 17)) -> None:
    """The server's accumulates over more ranks than ``kernels.cuda.sums.RANK_GROUP`` stages at once (a full group,
    then a part of one), rank by rank in float32 as the CPU kernels: the lane sums' (values and the sum of |x|^p, with
    and without a base, into a strided row view of a wire buffer) and the block weights' (base and none)."""
    rng = np.random.default_rng(numel)
    for n in ranks:
        wire = rng.integers(0, 256, (n, 3 + -(-numel // 8)), dtype=np.uint8)
        rows, d_rows = wire[:, 3:], numba_cuda.to_device(wire)[:, 3:]
        weights = (rng.standard_normal(n) * np.exp2(rng.integers(-20, 21, n))).astype(np.float32)
        base = (rng.standard_normal(numel) * np.exp2(rng.integers(-20, 21, numel))).astype(np.float32)
        for power, added in ((2, None), (1, base), (2, base)):
            out, d_out = np.empty(numel, np.float32), numba_cuda.device_array(numel, np.float32)
            want = cpu.accumulate_signs(rows.copy(), weights, added, out, numel, power)
            got = cuda.accumulate_signs(d_rows, numba_cuda.to_device(weights),
                                        None if added is None else numba_cuda.to_device(added), d_out, numel, power)
            assert got == want and np.array_equal(d_out.copy_to_host(), out), ("accumulate_signs", n, power)
        block = 64
        blocks = -(-numel // block)
        block_weights = (rng.random((n, blocks)) + 0.5).astype(np.float32)
        for added in (None, base):
            out, d_out = np.empty(numel, np.float32), numba_cuda.device_array(numel, np.float32)
            cpu.accumulate_blocks(rows, block_weights, block, added, out, numel)
            cuda.accumulate_blocks(d_rows, numba_cuda.to_device(block_weights), block,
                                   None if added is None else numba_cuda.to_device(added), d_out, numel)
            assert np.array_equal(d_out.copy_to_host(), out), ("accumulate_blocks", n, added is None)


def check_group_sums() -> None:
    """Past ``TAIL`` lane sums the last block of each group of thread blocks adds its part of the tree's wide levels,
    and the last group the rest (``kernels.cuda.sums._finish_lanes``), in the reference's order: with several groups, a
    group of several thread blocks, one thread walking several lane sums, and threads sharing one value of the
    tree (``SUBTREES``) in shared memory."""
    for blocks, tail, threads, numel in ((4, 64, 32, 30011), (8, 64, 256, 40011)):
        if threads != cuda.sums.LANE_THREADS and not config.ENABLE_CUDASIM:
            continue  # a GPU's kernels keep the LANE_THREADS they were compiled with (their staging stride)
        cuda.common.MAX_BLOCKS, cuda.sums.TAIL, cuda.sums.LANE_THREADS = blocks, tail, threads
        check_lane_sums((numel,), (torch.float32,), (2,))


def check_segment_sums(sizes: tuple[int, ...] = (0, 1, 37, 8193, 5, 300)) -> None:
    """Every segment's sum of squares (``segment_sumsq``): CUDA = CPU = ``sumsq`` of the segment alone, on inputs
    whose sums depend on the order, over empty segments, one past a summation block and a tail past the last."""
    rng = np.random.default_rng(17)
    numel = sum(sizes) + 3
    x = (rng.standard_normal(numel) * np.exp2(rng.integers(-20, 21, numel))).astype(np.float32)
    tables, blocks = codecs.sums._segment_tables(tuple(np.concatenate([[0], np.cumsum(sizes)]).tolist()),
                                                 torch.device("cpu"))
    bounds, firsts = tables.numpy()
    want = np.empty(len(sizes))
    cpu.segment_sumsq(x, bounds, firsts, blocks, want)
    d_out = numba_cuda.device_array(len(sizes), np.float64)
    cuda.segment_sumsq(numba_cuda.to_device(x), numba_cuda.to_device(bounds), numba_cuda.to_device(firsts), blocks,
                       d_out)
    each = [cpu.compensated_power_sum(x[:0], None, x[lo:hi], 0, 2) for lo, hi in zip(bounds[:-1], bounds[1:])]
    assert np.array_equal(want, each) and np.array_equal(d_out.copy_to_host(), want), "segment_sumsq"


def check_scale_of() -> None:
    """The device scale has ``spec.scale_from``'s bits, for both scales, over sums of many magnitudes."""
    rng = np.random.default_rng(5)
    totals = np.concatenate([[0.0, 1.0, 2.0, 3.0, 1e-300, 5e-324, 1e300, np.inf, np.nan],
                             rng.random(200) * 10.0 ** rng.integers(-30, 30, 200)])
    out = numba_cuda.device_array(1, np.float32)
    for name, power in SCALES.items():
        for d in (0, 1, 3, 8, 37, 8200, 12345678, 2 ** 40 + 3):
            for total in totals:
                cuda.scale_of(numba_cuda.to_device(np.array([total])), d, power, out)
                got, want = out.copy_to_host()[0], spec.scale_from(float(total), d, name)
                assert got.tobytes() == want.tobytes() or (np.isnan(got) and np.isnan(want)), (name, d, total)


def check_arguments() -> None:
    """Kernel arguments a GPU would fault on, or read past, are refused under the simulator, whose host memory would
    take them: a float32 view one byte into its tensor, and one reaching past its tensor's end; the aligned view
    inside it launches."""
    wire = torch.zeros(16, dtype=torch.uint8)
    total = DeviceArray.of(torch.ones(1, dtype=torch.float64))
    aligned = DeviceArray(wire.data_ptr() + 4, (1,), (4,), np.dtype(np.float32), wire)
    launch.launch(cuda.records._scale_of, 1, 1, 0, total, 8, 8.0 ** 0.5, True, aligned)
    assert wire[4:8].view(torch.float32).numpy()[0] == spec.scale_from(1.0, 8, "l2"), "the aligned view"
    for offset, shape, wanted in ((1, (1,), "is not 4-byte aligned: a GPU faults on it"),
                                  (12, (2,), "at byte 12 of its tensor's 16 reaches outside it")):
        try:
            launch.launch(cuda.records._scale_of, 1, 1, 0, total, 8, 8.0 ** 0.5, True, DeviceArray(
                wire.data_ptr() + offset, shape, (4,), np.dtype(np.float32), wire))
        except ValueError as error:
            assert wanted in str(error), error
        else:
            raise AssertionError(f"a float32 view at byte {offset} of 16, shape {shape}, launched under the simulator")


def _checked_kernel(body: str):
    """A kernel of blocks of 32 threads: each thread writes its element of a shared array, the block meets at a
    barrier, then each does ``body``; a thread's element of ``out`` is o = 32 x its block + its thread. Wrong: "write,
    read neighbour" (its shared element again, then the next thread's), "read neighbour, write" (the other order),
    "past the end" (the next thread's: the last one's is past the array), "unwritten" (its element of a second
    shared array, which no thread writes), "global race" (writes out[o], then reads the next thread's), "divergent"
    (half the threads wait at one barrier, half at another), "unfenced" (writes out[o], then thread 0 counts in
    ``counter``), "unordered" (the same with a fence, but no barrier), "fenced by one before the barrier" (writes
    out[o], thread 0 fences, a barrier, thread 0 counts), "same elements" (each block writes out[thread]),
    "unpublished" (writes out[o], then reads the other block's), "ordered by another count" (each block counts
    alone in a count of its own, as the last block of a group, then reads the other block's out[o]). Right: "read
    neighbour", "own" (its own shared element), "published" (out[o], the fence, a barrier, the count; the block that
    counts last adds the other block's out[o] to its own after a barrier), "published by one" (out[o], a barrier,
    then thread 0 fences, counts, and in the last block fences again: ``_last_block``'s form), "counted in groups"
    (each block counts as the last of its group in counter[1 + its block], adds 1 to out[o], then counts in
    counter[0]; the last adds the other's: ``_finish_lanes``' form)."""

    @numba_cuda.jit
    def kernel(out, counter):
        s = numba_cuda.shared.array(32, np.float32)
        unwritten = numba_cuda.shared.array(32, np.float32)
        last = numba_cuda.shared.array(1, np.int32)
        t = numba_cuda.threadIdx.x
        o = numba_cuda.blockIdx.x * 32 + t
        s[t] = t
        numba_cuda.syncthreads()
        if body == "write, read neighbour":
            s[t] = t + 1
            out[o] = s[(t + 1) % 32]
        elif body == "read neighbour, write":
            out[o] = s[(t + 1) % 32]
            s[t] = 0
        elif body == "read neighbour":
            out[o] = s[(t + 1) % 32]
        elif body == "own":
            out[o] = s[t]
        elif body == "past the end":
            out[o] = s[t + 1]
        elif body == "unwritten":
            out[o] = unwritten[t]
        elif body == "global race":
            out[o] = t
            out[o] = out[o - t + (t + 1) % 32] + 1
        elif body == "divergent":
            if t < 16:
                numba_cuda.syncthreads()
            else:
                numba_cuda.syncthreads()
        elif body == "same elements":
            out[t] = s[t]
        elif body == "unpublished":
            out[o] = s[t]
            out[o] += out[(o + 32) % 64]
        elif body in ("published by one", "fenced by one before the barrier", "counted in groups",
                      "ordered by another count"):
            out[o] = s[t]
            if body in ("counted in groups", "ordered by another count"):
                numba_cuda.syncthreads()
                if t == 0:
                    numba_cuda.threadfence()
                    numba_cuda.atomic.add(counter, 1 + numba_cuda.blockIdx.x, 1)
                    numba_cuda.threadfence()
                numba_cuda.syncthreads()
                if body == "ordered by another count":
                    if numba_cuda.blockIdx.x == 1:
                        out[o] += out[(o + 32) % 64]
                    return
                out[o] += 1
            if body == "fenced by one before the barrier" and t == 0:
                numba_cuda.threadfence()
            numba_cuda.syncthreads()
            if t == 0:
                if body != "fenced by one before the barrier":
                    numba_cuda.threadfence()
                last[0] = numba_cuda.atomic.add(counter, 0, 1) % 2
                if last[0] == 1:
                    numba_cuda.threadfence()
            numba_cuda.syncthreads()
            if last[0] == 1:
                out[o] += out[(o + 32) % 64]
        else:
            out[o] = s[t]
            if body != "unfenced":
                numba_cuda.threadfence()
            if body == "published":
                numba_cuda.syncthreads()
            if t == 0:
                last[0] = numba_cuda.atomic.add(counter, 0, 1) % 2
            numba_cuda.syncthreads()
            if body == "published" and last[0] == 1:
                out[o] += out[(o + 32) % 64]

    return kernel


def check_race_checks() -> None:
    """The simulator's checks (``simulator``, installed by ``main``) fail each wrong form of ``_checked_kernel``
    with their error naming it, and pass the right ones with their results (on two blocks, which also share the
    simulator's shared arrays, one after the other)."""
    assert config.ENABLE_CUDASIM, "the race checks are the simulator's (compute-sanitizer's on a GPU)"
    out, counter = numba_cuda.device_array(64, np.float32), numba_cuda.to_device(np.zeros(3, np.int32))
    for body, blocks, error, words in (
            ("write, read neighbour", 1, simulator.DataRace, "with no barrier between"),
            ("read neighbour, write", 1, simulator.DataRace, "with no barrier between"),
            ("past the end", 1, IndexError, "is not one element"),
            ("unwritten", 1, simulator.UninitializedShared, "has written it"),
            ("global race", 1, simulator.DataRace, "global array (64,)["),
            ("divergent", 1, simulator.DivergentBarrier, "waits at the barrier"),
            ("unfenced", 1, simulator.UnpublishedWrites, "thread"),
            ("unordered", 1, simulator.UnpublishedWrites, "with no barrier after"),
            ("fenced by one before the barrier", 1, simulator.UnpublishedWrites, "is not fenced"),
            ("same elements", 2, simulator.DataRace, "no count orders the two blocks"),
            ("unpublished", 2, simulator.DataRace, "no count orders the two blocks"),
            ("ordered by another count", 2, simulator.DataRace, "no count orders the two blocks")):
        try:
            _checked_kernel(body)[blocks, 32](out, counter)
        except error as exc:
            assert words in str(exc), (body, str(exc))
        else:
            raise AssertionError(f"a kernel with {body!r} passed the simulator's checks")
    counter = numba_cuda.to_device(np.zeros(1, np.int32))
    for body, want in (("read neighbour", (np.arange(64) + 1) % 32), ("own", np.arange(64) % 32),
                       ("published", np.arange(64) % 32 * np.repeat([1, 2], 32)),
                       ("published by one", np.arange(64) % 32 * np.repeat([1, 2], 32))):
        _checked_kernel(body)[2, 32](out, counter)
        assert np.array_equal(out.copy_to_host(), want), (body, out.copy_to_host())
    assert counter.copy_to_host()[0] == 4, "each block counted once in each of the two counting bodies"
    counter = numba_cuda.to_device(np.zeros(3, np.int32))
    _checked_kernel("counted in groups")[2, 32](out, counter)
    assert np.array_equal(out.copy_to_host(), (np.arange(64) % 32 + 1) * np.repeat([1, 2], 32)), out.copy_to_host()
    assert counter.copy_to_host().tolist() == [2, 1, 1], "each block counted in its group's count and the grid's"


DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
PARTS = ("tree", "scale", *DTYPES, "blocks", "levels", "grid", "races")
"""The checks ``main`` runs, each independent of the others, so a caller can spread them over processes ("races",
the simulator's own checks, only under the simulator)."""


UNCHECKED = ("float16", "bfloat16")
"""Parts run without the simulator's access checks: their kernels are float32's with a lookup table, whose
accesses the "float32" part checks."""


def run_part(part: str, lengths: list[int]) -> None:
    """One part of ``PARTS``: the device tree and scale, one dtype's kernels at every length and world 1 and 3,
    the block-scale kernels, the level kernels, or the grid-stride loops (several tiles and lanes per block, and
    sums of more lane sums than one block adds)."""
    threads = cuda.sums.COLLAPSE_THREADS
    if config.ENABLE_CUDASIM:  # a Python thread per CUDA thread; the tree's order does not depend on the block
        cuda.sums.COLLAPSE_THREADS = 128
        simulator.check_accesses(part not in UNCHECKED)
    try:
        _run_part(part, lengths)
    finally:
        cuda.sums.COLLAPSE_THREADS = threads


def _run_part(part: str, lengths: list[int]) -> None:
    if part == "tree":
        check_tree_sum()
        check_lane_sums()
        check_many_ranks()
        check_segment_sums()
    elif part == "scale":
        check_scale_of()
        if config.ENABLE_CUDASIM:  # on a GPU the misaligned launch would fault, and take the context with it
            check_arguments()
    elif part in DTYPES:
        for numel in lengths:
            for world in (1, 3):
                check(numel, world, DTYPES[part])
    elif part == "blocks":
        for numel, block in ((37, 8), (1000, 64)):  # the simulator runs a thread per element: small lengths
            for dtype, world in ((torch.float32, 1), (torch.bfloat16, 3)):
                check_blocks(numel, world, dtype, block)
    elif part == "levels":
        for numel, world, dtype, block, bits in ((37, 1, torch.float32, 8, 3), (1000, 3, torch.bfloat16, 64, 2),
                                                 (203, 2, torch.float16, 16, 8), (99, 3, torch.float32, 256, 4)):
            check_levels(numel, world, dtype, block, bits)
    elif part == "grid":
        kept = (cuda.common.MAX_BLOCKS, cuda.sums.TAIL, cuda.sums.COLLAPSED, cuda.sums.LANE_THREADS,
                cuda.frames.DECODE_ROUND)
        cuda.common.MAX_BLOCKS, cuda.sums.TAIL, cuda.sums.COLLAPSED = 2, 32, 16  # past TAIL: one group; _collapse
        cuda.frames.DECODE_ROUND = 2  # the framed decoders' blocks take several rounds of 2 tiles (the simulator's;
        # a GPU's keep the rounds they were compiled with, on a wider grid)
        try:  # walks several values a thread
            check(max(lengths), 3, torch.float16)
            check_lane_sums((20011,), (torch.float32,), (2,))  # 3 summation blocks on 2 thread blocks: one
            # stages a second over the first
            check_many_ranks(20011, (17,))  # rank groups' sums kept in shared memory across summation blocks
            check_group_sums()
            check_segment_sums((8193, 3, 0, 5))  # 5 summation blocks and 4 segments on 2 thread blocks
            rng = np.random.default_rng(6)  # more ranks than a block's threads: the weights' grid is wider
            check_agreed_encode(rng.standard_normal(37).astype(np.float32), None,
                                (rng.standard_normal(40) * 0.3).astype(np.float32), 37, 300, 1234.5, rng)
            check_blocks(1000, 3, torch.float16, 128)
            check_blocks(8200, 3, torch.float16, 8)  # more summation blocks than threads: several groups a block
            check_levels(8200, 3, torch.float32, 8, 4)
            rng = np.random.default_rng(4)  # 3 rows of 3 pieces of 32 lanes on 2 thread blocks: each block walks
            source = rng.standard_normal(49157).astype(np.float32)  # several; the last block gives each thread
            check_row_maxima(source, None, 49157, 3)  # whole rows, then (none a thread) reduces each with them all
            by_thread, cuda.randomized.ROW_A_THREAD = cuda.randomized.ROW_A_THREAD, 0
            try:
                check_row_maxima(source, None, 49157, 3)
            finally:
                cuda.randomized.ROW_A_THREAD = by_thread
            rng = np.random.default_rng(5)  # more scales a row than CODE_THREADS, more rows than blocks
            _check_codes(rng.random(3 * 700) * 10.0, 8, 8 * 700 - 3, 2, 3, rng)
            per_thread, cuda.scales.CODE_SCALES_PER_THREAD = cuda.scales.CODE_SCALES_PER_THREAD, 1
            try:  # rows split over 3 blocks, their largest in the last part of one and the first of another
                scales = rng.random((3, 700)) * 10.0
                scales[0, 699], scales[2, 3] = 20.0, 30.0
                _check_codes(scales.reshape(-1), 8, 8 * 700 - 3, 2, 3, rng)
                _check_codes(scales.reshape(-1).astype(np.float32), 8, 8 * 700, 0, 3, rng)
                _check_codes(scales.reshape(-1).astype(np.float32), 8, 8 * 700, -4, 3, rng)
            finally:
                cuda.scales.CODE_SCALES_PER_THREAD = per_thread
            coding = (cuda.scales.CODE_THREADS, cuda.scales.CODE_SCALES_PER_THREAD)
            if config.ENABLE_CUDASIM:  # a GPU's coders keep the CODE_THREADS they were compiled with
                cuda.scales.CODE_THREADS, cuda.scales.CODE_SCALES_PER_THREAD = 32, 16
            try:  # more scales a thread than it loads at once (IN_FLIGHT): rows of 400 in one block (13 a thread),
                # rows of 700 in 2 parts (11 a thread)
                _check_codes(rng.random(3 * 400) * 10.0, 8, 8 * 400 - 3, 2, 3, rng)
                _check_codes(rng.random(3 * 700).astype(np.float32), 8, 8 * 700, -4, 3, rng)
            finally:
                cuda.scales.CODE_THREADS, cuda.scales.CODE_SCALES_PER_THREAD = coding
        finally:
            (cuda.common.MAX_BLOCKS, cuda.sums.TAIL, cuda.sums.COLLAPSED, cuda.sums.LANE_THREADS,
             cuda.frames.DECODE_ROUND) = kept
    elif part == "races":
        check_race_checks()
    else:
        raise ValueError(f"unknown part {part!r}; the parts are {PARTS}")


def main(argv: list[str]) -> int:
    """Run the ``--part`` parts (all by default) on the lengths given (1, 37, 1000 and 8200 by default)."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("lengths", type=int, nargs="*", default=[1, 37, 1000, 8200])
    parser.add_argument("--part", action="append", choices=PARTS, help="one part (repeatable); default: all")
    args = parser.parse_args(argv)
    assert numba_cuda.is_available(), "no CUDA device and no simulator (set NUMBA_ENABLE_CUDASIM=1)"
    if config.ENABLE_CUDASIM:
        simulator.install()
        cuda.scales.CODE_THREADS = 32  # a Python thread per CUDA thread; rows of more scales than threads all the same
    else:
        simulator.quiet_warnings()
    parts = args.part or [part for part in PARTS if config.ENABLE_CUDASIM or part != "races"]
    for part in parts:
        run_part(part, args.lengths)
    print(f"cuda kernels == cpu kernels: {', '.join(parts)} on lengths {args.lengths}, world 1 and 3")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
