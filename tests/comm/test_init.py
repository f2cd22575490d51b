"""compcoll.init() picks the communicator from the environment."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import compcoll
from compcoll.comm import torch_backend
from compcoll.launcher import mpiexec_command
from tests.leftovers import segments

_PROBE = "import compcoll; c = compcoll.init(); print(type(c).__name__, c.rank, c.size)"
_LAUNCH_VARS = ("PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "PMIX_SIZE", "SLURM_NTASKS", "WORLD_SIZE", "MASTER_ADDR",
                "TORCHELASTIC_RUN_ID")
_RANK_FILE_PROBE = ("import compcoll, pathlib, sys\nc = compcoll.init()\n"
                    "pathlib.Path(sys.argv[1], str(c.rank)).write_text(f'{type(c).__name__} {c.rank} {c.size}')\n"
                    "compcoll.shutdown()\n")
"""Each rank writes its communicator's kind, rank and size to its own file in the folder ``sys.argv[1]`` (lines
forwarded by a launcher may interleave)."""


_SHUTDOWN_PROBE = """
import os, weakref
import torch
import compcoll
from compcoll.optim import OneBitAdam


def gloo_threads():
    names = []
    for task in os.listdir("/proc/self/task"):
        try:
            names.append(open(f"/proc/self/task/{task}/comm").read())
        except OSError:
            pass
    return sum(name.startswith(("gloo", "pt_gloo")) for name in names)


comm = compcoll.init()
model = torch.nn.Linear(30, 2)
optimizer = OneBitAdam(model.parameters(), lr=1e-3, freeze_step=1, comm=comm)
for _ in range(3):
    model(torch.randn(4, 30)).sum().backward()
    optimizer.step()
    optimizer.zero_grad()
group = weakref.ref(comm.group)
before = gloo_threads()
compcoll.shutdown()
print("threads", before, gloo_threads(), "group freed", group() is None)
comm.barrier()
"""
"""A OneBitAdam built after ``compcoll.init()`` holds its communicator across ``compcoll.shutdown()``: prints the Gloo
threads before and after, and whether the group was freed, then calls the communicator."""


def _clean_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k not in _LAUNCH_VARS}


def test_no_launcher_gives_single(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in _LAUNCH_VARS:
        monkeypatch.delenv(var, raising=False)
    comm = compcoll.init()
    assert isinstance(comm, compcoll.SingleComm) and comm.size == 1
    assert compcoll.get_default() is comm


@pytest.mark.parametrize("value", ["abc", "", " 1 "])
def test_a_launcher_count_that_is_no_number_or_one_gives_single(value: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """``PMI_SIZE`` that says no number of processes, or one, names no launcher of several (``init`` read it with
    ``int()`` before 2026-12-04, and "abc" raised ValueError from inside it)."""
    for var in _LAUNCH_VARS:
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("PMI_SIZE", value)
    assert isinstance(compcoll.init(), compcoll.SingleComm)


def test_mpiexec_gives_mpicomm(tmp_path: Path) -> None:
    subprocess.run([*mpiexec_command(), "-n", "2", sys.executable, "-c", _RANK_FILE_PROBE, str(tmp_path)],
                   env=_clean_env(), capture_output=True, text=True, timeout=120, check=True)
    assert sorted(p.read_text() for p in tmp_path.iterdir()) == ["MPIComm 0 2", "MPIComm 1 2"]


def test_torchrun_variables_give_torchcomm() -> None:
    env = {**_clean_env(), "RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29581"}
    out = subprocess.run([sys.executable, "-c", _PROBE + "; import torch.distributed as d; d.destroy_process_group()"],
                         env=env, capture_output=True, text=True, timeout=120, check=True).stdout
    # torch 2.10's Gloo prints "[Gloo] Rank 0 is connected to 0 peer ranks..." on stdout first
    assert "TorchComm 0 1" in out.splitlines(), out


def test_torchrun_inside_an_srun_step_gives_torchcomm(tmp_path: Path) -> None:
    """``srun torchrun --nproc-per-node 2 ...`` where Slurm's PMI plugin exports ``PMI_SIZE`` to the step's task
    (pmi2, cray_shasta): torchrun's workers inherit the step's count, and open torch.distributed, not MPI (which
    refused them as a launcher not of its MPI: "the launcher started 2 processes (PMI_SIZE=2)")."""
    probe = tmp_path / "probe.py"
    probe.write_text(_RANK_FILE_PROBE)
    env = {**_clean_env(), "PMI_SIZE": "2", "PMI_RANK": "0"}
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                           str(probe), str(tmp_path)], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    found = sorted(p.read_text() for p in tmp_path.iterdir() if p.name != probe.name)
    assert found == ["TorchComm 0 2", "TorchComm 1 2"], found


@pytest.mark.parametrize("env, cuda, gpus, backend", [
    ({}, False, 0, "gloo"),
    ({"LOCAL_WORLD_SIZE": "2"}, True, 2, "nccl"),
    ({"LOCAL_WORLD_SIZE": "2"}, True, 1, "gloo"),  # torchrun --nproc-per-node 2 on one GPU: NCCL cannot pair them
    ({}, True, 1, "nccl"),
    ({"COMPCOLL_TORCH_BACKEND": "gloo", "LOCAL_WORLD_SIZE": "1"}, True, 8, "gloo"),
])
def test_torch_backend_choice(env: dict, cuda: bool, gpus: int, backend: str) -> None:
    assert torch_backend(env, cuda, gpus) == backend


@pytest.mark.parametrize("env, cuda, gpus, words", [
    ({"COMPCOLL_TORCH_BACKEND": "nccl"}, False, 0, "needs a CUDA GPU"),
    ({"COMPCOLL_TORCH_BACKEND": "nccl", "LOCAL_WORLD_SIZE": "4"}, True, 1, "a GPU for each of this node's 4 ranks"),
])
def test_nccl_without_a_gpu_per_rank_is_refused(env: dict, cuda: bool, gpus: int, words: str) -> None:
    with pytest.raises(RuntimeError, match=words):
        torch_backend(env, cuda, gpus)


def test_unknown_backend() -> None:
    with pytest.raises(ValueError, match="unknown backend"):
        compcoll.init("carrier-pigeon")


_DIES = """
import sys, time, torch, compcoll
comm = compcoll.init()
if comm.rank == 1:
    raise RuntimeError("rank 1 gives up")
time.sleep(0.5)
compcoll.compressed_allreduce(torch.ones(100), torch.zeros(104), torch.zeros(52), comm)
"""


def test_uncaught_error_on_one_mpi_rank_ends_the_job() -> None:
    """Rank 1 dies of an uncaught exception while rank 0 waits in a collective (timeout 120 s): the job ends
    (this test gives it 100 s), the traceback shown, rather than after rank 0's timeout; and the job leaves no
    segment of MPICH's in /dev/shm, which MPI_Abort left (Hydra's topology file in /tmp it still leaves)."""
    env = {**_clean_env(), "COMPCOLL_TIMEOUT": "120"}
    before = segments()
    done = subprocess.run([*mpiexec_command(), "-n", "2", sys.executable, "-c", _DIES], env=env,
                          capture_output=True, text=True, timeout=100)
    output = done.stdout + done.stderr
    assert done.returncode != 0 and "rank 1 gives up" in output and "aborting the job" in output, output
    assert "CollectiveTimeout" not in output, output
    assert segments() <= before


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="the message is for machines without a GPU")
def test_nccl_without_a_gpu_says_so() -> None:
    env = {**_clean_env(), "RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29583",
           "COMPCOLL_TORCH_BACKEND": "nccl"}
    done = subprocess.run([sys.executable, "-c", _PROBE], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode != 0 and "needs a CUDA GPU" in done.stderr and "ZeroDivisionError" not in done.stderr


def test_shutdown_ends_the_gloo_threads_while_an_optimizer_holds_its_communicator() -> None:
    """``compcoll.shutdown()`` on 1 Gloo rank (torchrun's variables) with a OneBitAdam built after ``init()`` still
    holding the communicator: the group is freed and no Gloo thread is left; the communicator then refuses a call,
    naming the destroyed group. Before 2026-12-04 the communicator held the group (and so did torch's
    ``torch.distributed.nn.functional``, first imported by the optimizer, in its default arguments): its 3 threads
    ran into the interpreter's exit, where a worker freeing a finished collective's tensors aborted the process now
    and then (a CI run of examples/lightning_trainer.py and tests/ddp/lightning_spawn.py)."""
    env = {**_clean_env(), "RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29584"}
    done = subprocess.run([sys.executable, "-c", _SHUTDOWN_PROBE], env=env, capture_output=True, text=True,
                          timeout=120)
    assert "threads 3 0 group freed True" in done.stdout.splitlines(), done.stdout + done.stderr
    assert done.returncode != 0 and "CompcollError: TorchComm: its process group was destroyed" in done.stderr, \
        done.stderr
