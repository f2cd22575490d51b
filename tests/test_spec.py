"""Spec layer: the random streams' keys and the scales of sums, on one Python value as on arrays."""

from __future__ import annotations

import numpy as np

from compcoll import spec


def test_mix64_of_an_int_is_its_array_bits() -> None:
    """``mix64`` on one Python int (``stream_key``'s host path) = ``mix64`` on a uint64 array (the reference's), on
    random values and the ends of the range."""
    values = np.random.default_rng(5).integers(0, 2**64, 2000, dtype=np.uint64, endpoint=False)
    values = np.concatenate([values, np.array([0, 1, spec.GOLDEN, spec.MASK64], dtype=np.uint64)])
    mixed = spec.mix64(values)
    assert [spec.mix64(int(v)) for v in values] == [int(v) for v in mixed]


def test_stream_keys_keep_their_bits() -> None:
    """``stream_key`` gives the keys it gave as a chain of one-element uint64 arrays (so Birder's random bits do not
    move), parts taken modulo 2^64."""
    assert spec.stream_key(0, 0, 0, 0) == 2391539541053276776
    assert spec.stream_key(17, 5, 2, 3) == 5275971172899993829
    assert spec.stream_key(2**64 + 5, -1, 1, 1023) == 14542435304196912688
    assert spec.stream_key(1, 2**40, 2, 7) == 11762434316285941107
    assert spec.stream_key(np.int64(17), np.int64(5), 2, 3) == spec.stream_key(17, 5, 2, 3)


def test_scales_of_an_array_are_each_sums_bits() -> None:
    """``scales_from`` (a device agreement round's every rank's scale, from every rank's sum, on the host) =
    ``scale_from`` of each sum, bit for bit where it is a number, NaN where it is NaN: sums of many magnitudes,
    zeros, subnormals, the largest, Inf, NaN and negatives, over lengths up to past 2^40, both scales."""
    rng = np.random.default_rng(6)
    totals = np.concatenate([[0.0, 1.0, 1e-300, 5e-324, 1e300, np.finfo(np.float64).max, np.inf, -np.inf, np.nan,
                              -1.0], rng.random(200) * 10.0 ** rng.integers(-300, 300, 200)])
    for scale in spec.SCALES:
        for d in (0, 1, 37, 8200, 2**40 + 3):
            got = spec.scales_from(totals, d, scale)
            with np.errstate(over="ignore"):  # scale_from's float32 of a scale past float32's largest: Inf
                want = np.array([spec.scale_from(float(t), d, scale) for t in totals], np.float32)
            nan = np.isnan(want)
            assert got.dtype == np.float32 and np.array_equal(np.isnan(got), nan), (scale, d)
            assert got[~nan].tobytes() == want[~nan].tobytes(), (scale, d)
