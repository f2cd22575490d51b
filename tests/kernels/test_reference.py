"""The numpy reference itself: its building blocks and the properties §3.1 promises."""

from __future__ import annotations

import math

import numpy as np
import pytest

from compcoll.kernels import reference


def test_tree_sum_is_accurate() -> None:
    values = np.random.default_rng(0).random(1001)
    assert reference.tree_sum(values) == pytest.approx(math.fsum(values), rel=1e-14)
    assert reference.tree_sum(np.array([])) == 0.0


def test_sumsq_is_accurate() -> None:
    x = np.random.default_rng(1).standard_normal(50001).astype(np.float32)
    assert reference.sumsq(x) == pytest.approx(math.fsum(float(v) ** 2 for v in x), rel=1e-13)


def test_pack_unpack_round_trip_and_sign_of_zero() -> None:
    x = np.array([0.0, -0.0, 1.0, -2.0, 3.0, -1e-30, 5.0, 0.5, -7.0], np.float32)
    q = reference.sign(x)
    assert q.tolist() == [1, 1, 1, -1, 1, -1, 1, 1, -1]
    assert np.array_equal(reference.unpack(reference.pack(q), x.size), q)
    assert reference.pack(q)[0] == 0b11101011


def test_compress_is_exact_decomposition() -> None:
    rng = np.random.default_rng(2)
    x = rng.standard_normal(800).astype(np.float32)
    err = rng.standard_normal(800).astype(np.float32)
    bits, scale, new_err = reference.compress(x, err)
    assert scale == np.float32(np.linalg.norm((x + err).astype(np.float64)) / math.sqrt(800))
    decoded = scale * reference.unpack(bits, 800)
    assert np.allclose(decoded + new_err, x + err, atol=1e-6)


@pytest.mark.parametrize("world", [1, 2, 3, 4])
def test_world_is_consistent(world: int) -> None:
    rng = np.random.default_rng(world)
    numel = 1001
    full = reference.padded_numel(numel, world)
    xs = [rng.standard_normal(numel).astype(np.float32) for _ in range(world)]
    we = [np.zeros(full, np.float32)] * world
    se = [np.zeros(full // world, np.float32)] * world
    outs, _, _, sent = reference.compressed_allreduce(xs, we, se)
    assert all(np.array_equal(o, outs[0]) for o in outs)
    cb = full // world // 8
    assert sent[0] == (world - 1) * (reference.META_FIELDS * 8 + 2 * cb + 4)
    truth = np.mean(xs, axis=0)
    cosine = float(outs[0] @ truth / np.linalg.norm(outs[0]) / np.linalg.norm(truth))
    assert cosine > 0.5
