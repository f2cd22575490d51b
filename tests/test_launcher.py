"""The multi-process harness reports failures and kills runs that exceed their timeout."""

from __future__ import annotations

import threading
import time

import pytest
import torch

from compcoll.launcher import BACKENDS, EPHEMERAL_PORTS, WorkerFailure, _free_port, run, run_threads, seeded


def fails_on_last_rank(comm) -> None:
    if comm.rank == comm.size - 1:
        raise RuntimeError("deliberate failure")


def sleeps(comm, seconds: float) -> None:
    time.sleep(seconds)


@pytest.mark.parametrize("backend", ["mpi", "gloo"])
def test_failure_is_reported(backend: str) -> None:
    with pytest.raises(WorkerFailure, match="deliberate failure"):
        run("tests.test_launcher:fails_on_last_rank", 2, backend)


def test_timeout_kills_the_run() -> None:
    start = time.monotonic()
    with pytest.raises(WorkerFailure, match="timed out"):
        run("tests.test_launcher:sleeps", 2, "mpi", args=(60,), timeout=5)
    assert time.monotonic() - start < 30


def prints_a_lot(comm) -> None:
    print("x" * 200_000, flush=True)
    comm.barrier()


def test_large_output_does_not_block_the_ranks() -> None:
    out = run("tests.test_launcher:prints_a_lot", 3, "gloo", timeout=60)
    assert out.count("x" * 200_000) == 3


@pytest.mark.parametrize("backend", BACKENDS)
def test_each_rank_gets_its_own_prefix_and_environment(backend: str) -> None:
    run("tests.launcher_workers:placed", 3, backend,
        rank_prefix=[["env", f"PREFIXED={r}"] for r in range(3)], rank_env=[{"PLACED": str(r)} for r in range(3)])


def test_seeded_gives_every_thread_the_draws_of_its_own_process() -> None:
    """16 threads drawing under ``seeded(3)`` at once each get what ``torch.manual_seed(3)`` gives one process,
    and the global generator is left as it was."""
    torch.manual_seed(3)
    expected = torch.cat([torch.randn(50) for _ in range(20)])
    torch.manual_seed(11)
    before = torch.get_rng_state()
    drawn: list[torch.Tensor] = []

    def draw() -> None:
        for _ in range(20):
            with seeded(3):
                values = [torch.randn(50) for _ in range(20)]
        drawn.append(torch.cat(values))

    threads = [threading.Thread(target=draw) for _ in range(16)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(drawn) == 16 and all(torch.equal(d, expected) for d in drawn)
    assert torch.equal(torch.get_rng_state(), before)


def test_threads_take_a_function_and_name_it_when_a_rank_fails() -> None:
    seen: list[int] = []
    run_threads(lambda comm: seen.append(comm.rank), 3)
    assert sorted(seen) == [0, 1, 2]
    with pytest.raises(WorkerFailure, match=r"fails_on_last_rank on 2 threads: 1 failed(.|\n)*deliberate failure"):
        run_threads(fails_on_last_rank, 2)


def test_rendezvous_ports_come_from_below_the_ephemeral_range() -> None:
    """Ports for a store to bind later are free and outside the range outgoing connections draw from (a port from
    there may be taken by a connection before the store binds it: EADDRINUSE)."""
    import socket

    start = int(EPHEMERAL_PORTS.read_text().split()[0]) if EPHEMERAL_PORTS.exists() else 32768
    for _ in range(20):
        port = _free_port()
        assert port < start, (port, start)
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))
