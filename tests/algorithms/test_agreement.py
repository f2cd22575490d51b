"""The per-call agreement round: an all-gather up to 64 ranks, an allreduce of fixed size above."""

from __future__ import annotations

import pytest

from compcoll import spec
from tests import background
from tests.pool import run
from tests.thread_jobs import Batch
from tests.worlds import worlds

WORKERS = "tests.algorithms.agreement_workers"
AT_72_RANKS = Batch((f"{WORKERS}:summed_rounds", 72, ([], 0, False)), timeout=600)


@pytest.mark.parametrize("backend, world_size", worlds((1, 3, 4), mpi=2, gloo=4))
def test_summed_rounds_match_reference_and_fail_alike(backend: str, world_size: int, monkeypatch) -> None:
    """Forced at small n, on threads and on real MPI and Gloo: the reference's bits and bytes, and every error."""
    monkeypatch.setattr(spec, "GATHERED_AGREEMENT_RANKS", 0)
    run(f"{WORKERS}:summed_rounds", world_size, backend, args=([[37], [3, 7, 11], [12289]], 2, True))


@pytest.mark.parametrize("forced", [False, True], ids=["gathered", "summed"])
@pytest.mark.parametrize("backend, world_size", worlds((1, 3, 4), mpi=2, gloo=4))
def test_rounds_on_the_device_match_reference_and_fail_alike(backend: str, world_size: int, forced: bool,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """The rounds NCCL runs (the record written beside the call's sum, gathered or summed where it is, read back
    in the call's wait), on host tensors here, on threads and on real MPI and Gloo, as all-gathers and forced to
    allreduces (here too, before the threads start: they share the module): the reference's bits and bytes, and
    every error (tests/gpu runs them on NCCL)."""
    if forced:
        monkeypatch.setattr(spec, "GATHERED_AGREEMENT_RANKS", 0)
    run(f"{WORKERS}:device_rounds", world_size, backend, args=([[37], [3, 7, 11], [12289]], 2, True, forced))


@pytest.mark.parametrize("backend, world_size", worlds((3,), mpi=2, gloo=2))
def test_rounds_moved_to_the_device_after_the_first_calls_match_reference(backend: str, world_size: int) -> None:
    """``agrees_on_device`` set on a communicator after its first calls, then unset (threads, real MPI and Gloo):
    the reference's bits at every call (until 2026-12-05 the first round on the device failed in torch's copy)."""
    run(f"{WORKERS}:rounds_moved", world_size, backend, args=(1001, 3))


@background.job(AT_72_RANKS.make)
def test_summed_rounds_at_72_ranks() -> None:
    """72 in-process ranks take the allreduce rounds unforced: every bad input, refusal, mismatch and NaN fails on
    every rank alike (the bits and bytes at 256 ranks: tests/comm/test_local.py); in a background job
    (``tests/thread_jobs.py``)."""
    AT_72_RANKS.run(f"{WORKERS}:summed_rounds", 72, "threads", args=([], 0, False))


@pytest.mark.parametrize("n", [2, 65, 1024])
def test_round_bytes(n: int) -> None:
    """Up to 64 ranks a round sends 24 bytes to each peer; above, an allreduce of 80 bytes (2(n-1)/n of it), and
    8 more bytes to each peer where the call agrees on a scale."""
    for rank in (0, n - 1):
        plain, scaled = spec.agreement_shares(n, rank, False), spec.agreement_shares(n, rank, True)
        assert plain[rank] == scaled[rank] == 0
        if n <= spec.GATHERED_AGREEMENT_RANKS:
            assert sum(plain) == sum(scaled) == 24 * (n - 1)
        else:
            assert sum(plain) == 2 * (n - 1) * 80 // n and sum(scaled) == sum(plain) + 8 * (n - 1)
