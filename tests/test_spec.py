"""Spec layer: the random streams' keys, on one Python int as on arrays."""

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
