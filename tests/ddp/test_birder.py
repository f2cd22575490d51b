"""compcoll.ddp.birder_hook under real DDP: Birder's reference per bucket, identical replicas (threaded group, Gloo)."""

from __future__ import annotations

import pickle

import pytest

import compcoll.ddp
from tests.ddp import ddp_workers
from tests.ddp.test_onebit import on
from tests.ddp.threaded_group import run_threaded_group


@pytest.mark.parametrize("backend, world_size", [("threads", 1), ("threads", 2), ("threads", 4), ("gloo", 4)])
def test_buckets_match_the_reference(backend: str, world_size: int) -> None:
    on(backend, "birder_matches_reference", world_size, 3)


def test_float64_complex_and_sparse_buckets_match_the_reference() -> None:
    """``OddModel``: a float64 bucket compressed through float32, a complex64 weight's, and a sparse gradient's bucket
    by DDP's own allreduce (on Gloo, as the 1-bit hook's test), all ranks' parameters the same bits."""
    on("gloo", "birder_matches_reference", 3, 3, True)


def test_buckets_with_nccls_rounds_on_the_device_match_the_reference() -> None:
    """The hook's rounds as over NCCL (``Communicator.agrees_on_device``), on Gloo ranks, which NCCL cannot run on
    one GPU: every bucket Birder's reference, every plan's round on the device."""
    on("gloo", "birder_matches_reference", 4, 3, False, True)


def test_states_unpickled_with_other_seeds_are_refused() -> None:
    run_threaded_group(ddp_workers.birder_unpickled_with_other_seeds, 2,
                       before_init=lambda rank: pickle.dumps(compcoll.ddp.BirderState(seed=rank)))
