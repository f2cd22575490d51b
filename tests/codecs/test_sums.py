"""codecs.sums: sums and scales against the numpy reference, and which of them wait for the host."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from compcoll import codecs
from compcoll.kernels import reference
from compcoll.kernels.launch import COUNTS
from compcoll.spec import SCALES
from tests.codecs.drawn import PROPERTY, same, vectors


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
        assert same(out.numpy(), want)
        assert same(np.float64(total), np.float64(reference.power_sum(want, SCALES[scale])))
