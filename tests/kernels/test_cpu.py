"""Fused Numba CPU kernels are bit-identical to the numpy reference, whatever the thread count."""

from __future__ import annotations

import os
import subprocess
import sys
import types

import numba
import numpy as np
import pytest
import torch
from numba.core.analysis import compute_cfg_from_blocks
from numba.core.compiler import CompilerBase, DefaultPassBuilder
from numba.core.compiler_machinery import FunctionPass, register_pass
from numba.core.typed_passes import ParforPreLoweringPass
from numba.parfors.parfor import Parfor

import compcoll
from compcoll import codecs, spec
from compcoll.bench.launches import protocol_calls
from compcoll.kernels import cpu, reference
from compcoll.spec import SCALES

LENGTHS = [1, 7, 31, 8191, 8193, 40001, 262147]


def _rng(numel: int) -> np.random.Generator:
    return np.random.default_rng(numel)


@pytest.mark.parametrize("scale", list(SCALES))
@pytest.mark.parametrize("numel", LENGTHS)
@pytest.mark.parametrize("world", [1, 3])
def test_compensate_and_encode(numel: int, world: int, scale: str) -> None:
    rng = _rng(numel)
    full = reference.padded_numel(numel, world)
    src = rng.standard_normal(numel).astype(np.float32)
    src[::11] = 0.0
    err = (rng.standard_normal(full) * 0.3).astype(np.float32)
    padded = np.zeros(full, np.float32)
    padded[:numel] = src

    total = cpu.compensated_power_sum(src, None, err, numel, SCALES[scale])
    assert total == reference.power_sum(padded + err, SCALES[scale])
    value = codecs.scale_from(total, full, scale)
    bits = np.empty(full // 8, np.uint8)
    new_err = err.copy()
    cpu.compensate_encode(src, None, new_err, numel, np.float32(value), bits)
    ref_bits, ref_scale, ref_err = reference.compress(padded, err, scale)
    assert value == ref_scale
    assert np.array_equal(bits, ref_bits) and np.array_equal(new_err, ref_err)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_sixteen_bit_inputs_convert_exactly(dtype: torch.dtype) -> None:
    numel = 10007
    t = torch.randn(numel, generator=torch.Generator().manual_seed(1)).to(dtype)
    full = reference.padded_numel(numel, 2)
    err = torch.randn(full, generator=torch.Generator().manual_seed(2))
    padded = np.zeros(full, np.float32)
    padded[:numel] = t.float().numpy()
    assert codecs.compensated_sum(t, err) == reference.sumsq(padded + err.numpy())
    assert codecs.compensated_sum(t, err, "l1") == reference.power_sum(padded + err.numpy(), 1)
    bits = torch.empty(full // 8, dtype=torch.uint8)
    work = err.clone()
    scale = codecs.scale_from(codecs.compensated_sum(t, err), full, "l2")
    codecs.compensate_encode(t, work, scale, bits)
    ref_bits, _, ref_err = reference.compress(padded, err.numpy())
    assert np.array_equal(bits.numpy(), ref_bits) and np.array_equal(work.numpy(), ref_err)


@pytest.mark.parametrize("scale", list(SCALES))
@pytest.mark.parametrize("numel", LENGTHS)
def test_accumulate_signs(numel: int, scale: str) -> None:
    """The server's accumulate (and its sum of |out|^p) = the reference's bits, threaded and serial, with and without
    a base (in place), and with a first rank of scale 0 (a zero vector's), whose signs add +0, never -0."""
    rng = _rng(numel)
    ranks = 3
    nbytes = -(-numel // 8)
    bits = rng.integers(0, 256, (ranks, nbytes), dtype=np.uint8)
    for scales in ((rng.random(ranks) + 0.5).astype(np.float32), np.array([0.0, 0.0, 0.7], np.float32)):
        weights = (scales / np.float32(ranks)).astype(np.float32)
        for first in (1, ranks):
            expected = reference.average_signs(list(bits[:first]), list(scales if first == ranks else weights[:1]),
                                               numel)
            for kernel in (cpu.accumulate_signs, cpu.SERIAL["accumulate_signs"]):
                out = np.empty(numel, np.float32)
                assert kernel(bits[:first], weights[:first], None, out, numel, SCALES[scale]) == reference.power_sum(
                    expected, SCALES[scale])
                assert np.array_equal(out.view(np.uint32), expected.view(np.uint32)), (scales, first, kernel)
                base = rng.standard_normal(numel).astype(np.float32)
                in_place = base.copy()
                kernel(bits[:first], weights[:first], in_place, in_place, numel, SCALES[scale])
                assert np.array_equal(in_place.view(np.uint32), (expected + base).astype(np.float32).view(np.uint32))


@pytest.mark.parametrize("numel", LENGTHS)
def test_select_decode(numel: int) -> None:
    rng = _rng(numel)
    ranks = 4
    nbytes = -(-numel // (8 * ranks))
    wire = rng.integers(0, 256, (ranks, nbytes + 3), dtype=np.uint8)
    rows = wire[:, 3:]
    scales = (rng.random(ranks) + 0.1).astype(np.float32)
    out = np.empty(numel, np.float32)
    cpu.select_decode(rows, scales, -scales, out, numel)
    expected = np.concatenate([s * reference.unpack(r, nbytes * 8) for r, s in zip(rows, scales)])[:numel]
    assert np.array_equal(out, expected)
    raw_positive, raw_negative = rng.integers(-2**15, 2**15, (2, ranks), dtype=np.int16)
    raw = np.empty(numel, np.int16)
    cpu.select_decode(rows, raw_positive, raw_negative, raw, numel)
    flags = np.concatenate([reference.unpack(r, nbytes * 8) > 0 for r in rows])[:numel]
    owners = np.arange(numel) // (nbytes * 8)
    assert np.array_equal(raw, np.where(flags, raw_positive[owners], raw_negative[owners])), "16-bit storage"


@pytest.mark.parametrize("numel", LENGTHS)
@pytest.mark.parametrize("ranks", [1, 2, 7])
def test_average_rows(numel: int, ranks: int) -> None:
    """Rows of mixed magnitudes (so that the order of the additions shows), with an Inf and a NaN past the first
    element, averaged as the reference (its serial twin too)."""
    rng = _rng(numel + ranks)
    rows = (rng.standard_normal((ranks, numel)) * 10.0 ** rng.integers(-3, 4, (ranks, numel))).astype(np.float32)
    rows[-1, numel // 2:][:2] = [np.inf, np.nan][:numel - numel // 2]
    expected = reference.average_rows(rows)
    for kernel in (cpu.average_rows, cpu.SERIAL["average_rows"]):
        out = np.empty(numel, np.float32)
        kernel(rows, out)
        assert np.array_equal(out, expected, equal_nan=True)


def test_results_do_not_depend_on_thread_count() -> None:
    rng = _rng(3)
    x = rng.standard_normal(300007).astype(np.float32)
    err = np.zeros(300008, np.float32)
    numba.set_num_threads(1)
    one = [cpu.compensated_power_sum(x, None, err, x.size, power) for power in (1, 2)]
    numba.set_num_threads(numba.config.NUMBA_NUM_THREADS)
    assert one == [cpu.compensated_power_sum(x, None, err, x.size, power) for power in (1, 2)]


def test_serial_twins_cache_apart_from_threaded_kernels() -> None:
    """Numba names its cache files after the function and keys their entries by signature alone: a twin compiled
    under its threaded kernel's name shared its cache entries, and later processes ran the threaded code for small
    inputs (60 us a call on 1024 elements instead of 1.5) or the serial code for large ones."""
    for name, twin in cpu.SERIAL.items():
        threaded = getattr(cpu, name)
        if threaded is not twin:
            assert twin.py_func.__qualname__ != threaded.py_func.__qualname__, name


@pytest.mark.parametrize("numel, world, block", [(1, 1, 8), (8193, 3, 64), (70001, 2, 128), (262147, 3, 8192),
                                                 (100003, 5, 16)])
def test_block_scale_kernels(numel: int, world: int, block: int) -> None:
    """One scale per block (blocks restart at each row, the last one of a row shorter where needed): sums, scales,
    encode into strided wire rows, accumulate and decode = the reference, threaded (as ``codecs`` runs them from
    65536 elements) and serial alike."""
    rng = _rng(numel + block)
    full = reference.padded_numel(numel, world)
    src = (rng.standard_normal(numel) * 10.0 ** rng.integers(-3, 3, numel)).astype(np.float32)
    src[::11] = 0.0
    err = (rng.standard_normal(full) * 0.3).astype(np.float32)
    padded = np.zeros(full, np.float32)
    padded[:numel] = src
    chunk = full // world
    blocks = -(-chunk // block)
    for kernels in (cpu, types.SimpleNamespace(**cpu.SERIAL)):
        for scale, power in SCALES.items():
            sums = np.empty(world * blocks, np.float64)
            kernels.block_power_sums(src, None, err, numel, block, chunk, power, sums)
            assert np.array_equal(sums, reference.block_sums(padded + err, block, power, world))
        ref_bits, scales, ref_err = reference.compress_blocks(padded, err, block, "l1", world)
        framed = np.zeros((world, 4 * blocks + chunk // 8), np.uint8)
        new_err = err.copy()
        kernels.encode_blocks(src, None, new_err, numel, scales, block, framed[:, 4 * blocks:])
        assert np.array_equal(framed[:, 4 * blocks:].reshape(-1), ref_bits) and np.array_equal(new_err, ref_err)
        assert not framed[:, :4 * blocks].any(), "the encoder wrote into the scales' bytes"

        rows = framed[:, 4 * blocks:]
        weights = scales.reshape(world, blocks)
        out = np.empty(chunk, np.float32)
        kernels.accumulate_blocks(rows, weights / np.float32(world), block, None, out, chunk)
        slices = [rows[r].copy() for r in range(world)]
        want = reference.average_block_signs(slices, list(weights), chunk, block)
        assert np.array_equal(out.view(np.uint32), want.view(np.uint32))
        base = rng.standard_normal(chunk).astype(np.float32)
        in_place = base.copy()
        kernels.accumulate_blocks(rows, weights / np.float32(world), block, in_place, in_place, chunk)
        assert np.array_equal(in_place.view(np.uint32), (want + base).astype(np.float32).view(np.uint32))
        silent = weights.copy()
        silent[0] = 0.0  # a zero rank's blocks: its signs add +0, never -0
        kernels.accumulate_blocks(rows, silent / np.float32(world), block, None, out, chunk)
        want = reference.average_block_signs(slices, list(silent), chunk, block)
        assert np.array_equal(out.view(np.uint32), want.view(np.uint32))
        decoded = np.empty(numel, np.float32)
        kernels.decode_blocks(rows, weights.view(np.uint32), block, np.uint32(1 << 31), decoded.view(np.uint32),
                              numel)
        lengths = np.tile(reference.block_lengths(chunk, block), world)
        assert np.array_equal(decoded, (np.repeat(scales, lengths) * reference.unpack(ref_bits, full))[:numel])


@pytest.mark.parametrize("rows, m", [(1, 70001), (1, 5), (3, 23457), (16, 4099)])
def test_code_blocks(rows: int, m: int) -> None:
    """``code_blocks`` (float32 scales, power 0) = ``spec.code_scales``: heads, codes and decoded scales, threaded (one
    row's codes in a parallel loop of their own, several rows' in tasks of ``CODES_A_TASK``) and serial alike, on
    scales over 40 octaves, zeros among them."""
    rng = _rng(rows * m)
    scales = (rng.random((rows, m)) * 2.0 ** rng.integers(-40, 0, (rows, m))).astype(np.float32)
    scales[:, ::13] = 0.0
    refs, codes, decoded = spec.code_scales(scales)
    for kernel in (cpu.code_blocks, cpu.SERIAL["code_blocks"]):
        wire = np.zeros((rows, spec.SCALE_BYTES + m + 3), np.uint8)
        got = np.empty((rows, m), np.float32)
        kernel(scales.reshape(-1), 1, 1, 0, spec.SCALE_STEPS, wire, got)
        assert np.array_equal(wire[:, :spec.SCALE_BYTES].copy().view(np.float32).reshape(-1), refs)
        assert np.array_equal(wire[:, spec.SCALE_BYTES:spec.SCALE_BYTES + m], codes)
        assert np.array_equal(got, decoded) and not wire[:, spec.SCALE_BYTES + m:].any()


def _decoded_levels(planes: np.ndarray, steps: np.ndarray, block: int, bits: int, row: int) -> np.ndarray:
    """Every row's levels times its steps, row after row: the reference's decode of served levels (0 + each value)."""
    half = ((1 << bits) - 1) / 2.0
    return np.concatenate([np.float32(0) + ((reference.unpack_planes(planes[r], bits, row) - half)
                                            * np.repeat(steps[r].astype(np.float64), block)[:row]).astype(np.float32)
                           for r in range(planes.shape[0])])


@pytest.mark.parametrize("numel, world, block, bits", [(37, 1, 8, 2), (8193, 3, 64, 3), (70001, 2, 256, 4),
                                                       (200003, 3, 8192, 8)])
def test_level_kernels(numel: int, world: int, block: int, bits: int) -> None:
    """Levels (one step per block, rows restarting the blocks): encode into strided wire rows, accumulate over the
    rows and decode each row into its own segment, cut short of the last row's end = the reference, threaded (as
    ``codecs`` runs them from 65536 elements) and serial alike; a negative level over a zero step decodes to +0, as
    accumulating from 0 does."""
    rng = _rng(numel + bits)
    full = reference.padded_numel(numel, world)
    row = full // world
    src = (rng.standard_normal(numel) * 10.0 ** rng.integers(-3, 3, numel)).astype(np.float32)
    err = (rng.standard_normal(full) * 0.3).astype(np.float32)
    err[:min(block, numel)] = src[:block] = 0.0
    padded = np.zeros(full, np.float32)
    padded[:numel] = src
    planes, steps, want_err = reference.compress_levels(padded, err, block, bits, world)
    blocks = -(-row // block)
    assert steps[0] == 0.0, "the first block is zero: its step is 0"
    heads = codecs.SCALE_BYTES + blocks
    steps = steps.reshape(world, blocks)
    for kernels in (cpu, types.SimpleNamespace(**cpu.SERIAL)):
        framed = np.zeros((world, heads + bits * row // 8), np.uint8)
        new_err = err.copy()
        kernels.encode_levels(src, None, new_err, numel, steps.reshape(-1), block, bits, framed[:, heads:])
        assert np.array_equal(framed[:, heads:], planes) and np.array_equal(new_err, want_err), "encode_levels"
        summed = np.empty(row - 3, np.float32)
        kernels.accumulate_levels(framed[:, heads:], steps, block, bits, summed, summed.size)
        each = _decoded_levels(planes, steps, block, bits, row).reshape(world, row)
        expected = np.zeros(row - 3, np.float32)
        for r in range(world):
            expected = (expected + each[r, :row - 3]).astype(np.float32)
        assert np.array_equal(summed.view(np.uint32), expected.view(np.uint32)), "accumulate_levels"
        decoded = np.full(full - 5, np.nan, np.float32)
        kernels.decode_levels(framed[:, heads:], steps, block, bits, decoded, decoded.size)
        assert np.array_equal(decoded.view(np.uint32), each.reshape(-1)[:full - 5].view(np.uint32)), "decode_levels"
        noise = rng.integers(0, 256, planes.shape, dtype=np.uint8)  # negative levels too, over the zero step
        kernels.decode_levels(noise, steps, block, bits, decoded, decoded.size)
        want = _decoded_levels(noise, steps, block, bits, row)[:full - 5]
        assert np.array_equal(decoded.view(np.uint32), want.view(np.uint32)), "decode_levels of random planes"


@pytest.mark.parametrize("groups, members, row_bytes, cut", [(1, 1, 1, 3), (3, 2, 1025, 8), (2, 5, 9001, 0),
                                                             (4, 3, 16384, 70001)])
def test_accumulate_groups(groups: int, members: int, row_bytes: int, cut: int) -> None:
    """Each group's rows summed into its own segment, the last cut short: each segment as ``accumulate_signs`` sums
    that group's rows (itself tested against the reference), threaded and serial alike; a zero weight among them."""
    rng = _rng(groups * row_bytes + members)
    bits = rng.integers(0, 256, (groups * members + 1, row_bytes + 2), dtype=np.uint8)[1:, 1:-1]  # strided rows
    weights = (rng.standard_normal((groups, members)) * 10.0 ** rng.integers(-3, 4, (groups, members))).astype(
        np.float32)
    weights[-1, 0] = 0.0
    seg = 8 * row_bytes
    count = groups * seg - cut
    expected = np.empty(groups * seg, np.float32)
    for j in range(groups):
        cpu.SERIAL["accumulate_signs"](bits[j * members:(j + 1) * members], weights[j], None,
                                       expected[j * seg:(j + 1) * seg], seg, 2)
    for kernel in (cpu.accumulate_groups, cpu.SERIAL["accumulate_groups"]):
        out = np.full(count, np.nan, np.float32)
        kernel(bits, weights, out, count)
        assert np.array_equal(out.view(np.uint32), expected[:count].view(np.uint32))


@pytest.mark.parametrize("sizes", [(0,), (1,), (5, 0, 37), (8191, 8192, 8193, 3, 20011), (70001, 1, 0, 16385)])
def test_segment_sumsq(sizes: tuple[int, ...]) -> None:
    """Every segment's sum of squares in one call, threaded and serial: the reference's, each segment's own
    ``compensated_power_sum`` bits, on values whose float64 sums depend on the order."""
    rng = _rng(sum(sizes))
    numel = sum(sizes) + 3
    x = (rng.standard_normal(numel) * np.exp2(rng.integers(-20, 21, numel))).astype(np.float32)
    tables, blocks = codecs.sums._segment_tables(tuple(np.concatenate([[0], np.cumsum(sizes)]).tolist()),
                                                 torch.device("cpu"))
    bounds, firsts = tables.numpy()
    want = reference.segment_sumsq(x, bounds)
    assert want.tolist() == [cpu.compensated_power_sum(x[:0], None, x[lo:hi], 0, 2)
                             for lo, hi in zip(bounds[:-1], bounds[1:])]
    for kernel in (cpu.segment_sumsq, cpu.SERIAL["segment_sumsq"]):
        out = np.full(len(sizes), np.nan)
        kernel(x, bounds, firsts, blocks, out)
        assert np.array_equal(out.view(np.uint64), want.view(np.uint64)), kernel


@pytest.mark.parametrize("numel, world, block", [(1, 1, 8), (37, 1, 8), (8193, 3, 64), (70001, 2, 256),
                                                 (200003, 3, 8192), (100003, 5, 16)])
def test_block_absmax(numel: int, world: int, block: int) -> None:
    """Each block's largest |x| of x = err + src (src zero past its end), threaded and serial: the reference's, on
    fresh random values of every magnitude, and NaN where a block holds one (in the source or the error), an
    infinity where it holds one."""
    rng = _rng(numel * block)
    full = reference.padded_numel(numel, world)
    chunk = full // world
    blocks = -(-chunk // block)
    for probe in range(3):
        src = (rng.standard_normal(numel) * 10.0 ** rng.integers(-3, 3, numel)).astype(np.float32)
        err = (rng.standard_normal(full) * 0.3).astype(np.float32)
        if probe == 1:
            src[rng.integers(0, numel, 2)] = np.nan
            err[full - 1] = -np.inf
        if probe == 2:
            err[rng.integers(0, full, 2)] = np.nan
            src[0] = np.inf
        padded = np.zeros(full, np.float32)
        padded[:numel] = src
        want = reference.block_absmax(padded + err, block, world)
        for kernel in (cpu.block_absmax, cpu.SERIAL["block_absmax"]):
            out = np.full(world * blocks, -1.0, np.float32)
            kernel(src, None, err, numel, block, chunk, out)
            assert np.array_equal(out, want, equal_nan=True), (probe, kernel)


class _Typed(Exception):
    """Raised by ``_StopAtParfors`` with a kernel's IR once Numba has made its parallel loops."""


@register_pass(mutates_CFG=False, analysis_only=True)
class _StopAtParfors(FunctionPass):
    """Ends a compilation right after Numba's parallel passes, handing their IR out (``_Typed``): no lowering."""

    _name = "compcoll_stop_at_parfors"

    def __init__(self) -> None:
        FunctionPass.__init__(self)

    def run_pass(self, state) -> bool:
        raise _Typed(state.func_ir)


class _UpToParfors(CompilerBase):
    """Numba's nopython pipeline up to its parallel loops (``_StopAtParfors``)."""

    def define_pipelines(self) -> list:
        passes = DefaultPassBuilder.define_nopython_pipeline(self.state)
        passes.add_pass_after(_StopAtParfors, ParforPreLoweringPass)
        passes.finalize()
        return [passes]


def _parallel_regions(kernel, signature) -> list[tuple[int, bool, bool]]:
    """Each parallel region of ``kernel`` (a threaded CPU kernel) typed for ``signature``: (its line, whether it is
    a ``prange`` of the source, whether it sits inside a loop). A region is a wake of Numba's threads each time it
    runs."""
    try:
        numba.njit(parallel=True, pipeline_class=_UpToParfors)(kernel.py_func).compile(signature)
    except _Typed as typed:
        blocks = typed.args[0].blocks
    else:
        raise AssertionError(f"{kernel.py_func.__name__}: Numba's pipeline ran past its parallel passes unstopped")
    loops = compute_cfg_from_blocks(blocks).loops().values()
    return [(stmt.loc.line, stmt.patterns[0][:2] == ("prange", "user"), any(label in loop.body for loop in loops))
            for label, block in blocks.items() for stmt in block.body if isinstance(stmt, Parfor)]


def test_every_parallel_region_is_a_prange_outside_any_loop() -> None:
    """Numba makes an array expression of a threaded kernel (a slice copied, ``np.zeros``, an array product) a
    parallel loop of its own, a wake of its threads each time it runs: 97-110 us on the 2-core machine, so that a
    row's 4 head bytes copied in a loop over 64 rows took 5.4-6.7 ms of a decode of 65,536 block codes that takes
    0.10-0.17 without them. Every kernel's parallel regions are its own ``prange`` loops, none inside a loop.

    The kernels are typed as every protocol's one-rank call on CPU tensors types their serial twins (and as 1-bit
    LAMB's segment sums and the server's lane sums), and compiled up to Numba's parallel loops alone."""
    for call in protocol_calls(torch.randn(4099), compcoll.SingleComm()).values():
        call()
    codecs.segment_sumsq(torch.randn(4099), (0, 99, 4099), torch.empty(2, dtype=torch.float64))
    cpu.SERIAL["accumulate_lanes"](np.zeros((2, 4), np.uint8), np.ones(2, np.float32), None,
                                   np.empty(32, np.float32), 32, np.empty(32, np.float64), 2)
    for name, twin in cpu.SERIAL.items():
        kernel = getattr(cpu, name)
        if not kernel.targetoptions.get("parallel"):
            continue
        assert twin.signatures, f"{name}: no call above typed it"
        regions = _parallel_regions(kernel, twin.signatures[0])
        assert regions and all(from_prange and not in_loop for _, from_prange, in_loop in regions), (name, regions)


def test_a_threading_layer_other_than_workqueue_is_warned_of_at_import() -> None:
    """compcoll sets Numba's workqueue layer where ``NUMBA_THREADING_LAYER`` is unset; a process told to use TBB
    (where a process whose kernels first ran off the main thread hung at exit, numba#10556) or any other layer warns
    at import, naming the variable and the hang."""
    assert cpu.common.layer_warning(None) is None and cpu.common.layer_warning("workqueue") is None
    for chosen in ("tbb", "omp", "default", "threadsafe"):
        assert f"NUMBA_THREADING_LAYER={chosen!r}" in cpu.common.layer_warning(chosen)
    if "NUMBA_THREADING_LAYER" not in os.environ:
        assert numba.config.THREADING_LAYER == "workqueue"
    env = {**os.environ, "NUMBA_THREADING_LAYER": "tbb"}
    done = subprocess.run([sys.executable, "-c", "import compcoll"], env=env, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0 and "RuntimeWarning" in done.stderr and "numba#10556" in done.stderr, done.stderr
