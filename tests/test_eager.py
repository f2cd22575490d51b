"""compcoll.eager: torch.compile around compcoll's optimizers (Gloo ranks) and collectives (MPI ranks)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.pool import run

WORKERS = "tests.eager_workers"


@pytest.mark.parametrize("name", ["OneBitAdam", "OneBitLamb", "ZeroOneAdam", "Birder"])
def test_a_compiled_training_step_equals_the_eager_one(name: str) -> None:
    run(f"{WORKERS}:compiled_step_equals_eager", 2, "gloo", args=(name,))


@pytest.mark.parametrize("backend, world_size", [("mpi", 1), ("gloo", 2)])
def test_the_collectives_inside_a_compiled_function_equal_the_eager_calls(backend: str, world_size: int) -> None:
    """On 1 rank, Dynamo tracing into the call failed; on 2 its trace happened to run."""
    run(f"{WORKERS}:compiled_calls_equal_eager", world_size, backend)


RACE = """
import sys, threading, torch
import compcoll
assert "torch._dynamo" not in sys.modules
comm, x = compcoll.SingleComm(), torch.randn(100)
we, se = torch.zeros(compcoll.padded_numel(100, 1)), torch.zeros(compcoll.padded_numel(100, 1))
importer = threading.Thread(target=lambda: __import__("torch._dynamo"))
importer.start()
while importer.is_alive():
    compcoll.compressed_allreduce(x, we, se, comm)
importer.join()
compcoll.compressed_allreduce(x, we, se, comm)
"""
"""A call made while another thread imports ``torch._dynamo`` (as torch does at a thread's first dispatch mode)."""


def test_a_call_while_another_thread_imports_dynamo_waits_for_the_import() -> None:
    """Before 2026-11-30 ``eager`` read the half-imported module from ``sys.modules`` and failed on its missing
    ``disable``: a thread world's rank that called while another began its first replay's recording raised."""
    subprocess.run([sys.executable, "-c", RACE], check=True, timeout=300, capture_output=True)
