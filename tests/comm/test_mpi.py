"""MPIComm: the MPI library's thread level, the job it sees, finalization, mpi4py missing."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from compcoll.launcher import mpiexec_command
from tests.hidden import run_without
from tests.pool import run


def _launched(processes: int, script: str) -> subprocess.CompletedProcess:
    """``script`` run by mpiexec on ``processes`` processes of their own (a fresh job, not the test pool's)."""
    return subprocess.run([*mpiexec_command(), "-n", str(processes), sys.executable, "-c", script],
                          capture_output=True, text=True, timeout=120)


def test_asynchronous_calls_refuse_an_mpi_without_thread_support() -> None:
    """Under MPI_THREAD_FUNNELED an asynchronous call raises a clear error at once; blocking calls still work."""
    script = (
        "import mpi4py; mpi4py.rc.thread_level = 'funneled'\n"
        "import torch, compcoll\n"
        "comm = compcoll.MPIComm()\n"
        "x, we, se = torch.randn(10), torch.zeros(16), torch.zeros(16)\n"
        "compcoll.compressed_allreduce(x, we, se, comm)\n"
        "try:\n"
        "    compcoll.compressed_allreduce(x, we, se, comm, async_op=True)\n"
        "except RuntimeError as exc:\n"
        "    assert 'MPI_THREAD_FUNNELED' in str(exc) and 'SERIALIZED' in str(exc), exc\n"
        "    print('refused')\n"
    )
    done = _launched(1, script)
    assert done.returncode == 0 and "refused" in done.stdout, done.stdout + done.stderr


def test_a_communicator_over_a_subgroup_knows_the_process_in_the_job() -> None:
    """Launched by mpiexec on 3 processes: an ``MPIComm`` over half of them and its split hold each process's rank in
    ``COMM_WORLD`` and its size (what names a checkpoint file), where their own ranks repeat across the halves."""
    script = (
        "import compcoll\n"
        "from mpi4py import MPI\n"
        "rank = MPI.COMM_WORLD.Get_rank()\n"
        "half = compcoll.MPIComm(MPI.COMM_WORLD.Split(rank % 2, rank))\n"
        "alone = half.split(half.rank)\n"
        "assert (half.rank, alone.rank) == (rank // 2, 0)\n"
        "assert (half.job_rank, half.job_size) == (alone.job_rank, alone.job_size) == (rank, 3)\n"
        "print('job', rank)\n"
    )
    done = _launched(3, script)
    assert done.returncode == 0 and done.stdout.count("job") == 3, done.stdout + done.stderr


def test_without_mpi4py_the_error_says_how_to_install_it() -> None:
    """Where mpi4py is missing, ``MPIComm()`` and ``compcoll.init()`` under an MPI launcher's variables raise a
    ModuleNotFoundError that names the extra to install, not Python's bare "No module named 'mpi4py'"."""
    out = run_without("mpi4py", "import os\n"
                                "import compcoll\n"
                                "for make in (compcoll.MPIComm, compcoll.init):\n"
                                "    os.environ['PMI_SIZE'] = '2'\n"
                                "    try:\n"
                                "        make()\n"
                                "    except ModuleNotFoundError as error:\n"
                                "        print(error.name, '|', error)\n")
    lines = out.splitlines()
    assert len(lines) == 2, out
    for line in lines:
        assert line.startswith("mpi4py | compcoll.MPIComm needs mpi4py"), line
        assert "pip install 'compcoll[mpi]'" in line, line


def test_a_rank_whose_communicator_broke_finalizes_mpi_before_python_tears_down(tmp_path) -> None:
    """After a timeout a rank's communicator keeps the operations it had in flight; that rank finalizes MPI at exit
    while their buffers live (``comm.mpi.finalize_before_teardown``); a rank whose communicator is whole leaves
    finalization to mpi4py, after the teardown. Without it, Open MPI 5 ranks of the stalled-rank test crashed at exit
    (SIGSEGV in 4 of 6 runs)."""
    run("tests.comm.comm_workers:finalized_before_teardown", 2, "mpi", args=(str(tmp_path),), timeout=60, breaks=True)
    assert (tmp_path / "0").read_text() == "1", "the rank whose communicator broke left MPI_Finalize to the teardown"
    assert (tmp_path / "1").read_text() == "0", "a rank with a whole communicator finalized MPI early"


def test_processes_a_launcher_counts_as_several_but_mpi_holds_alone_are_refused() -> None:
    """Processes a launcher says are several, each alone in MPI's COMM_WORLD (the mark of an mpiexec or srun that is
    not of the MPI mpi4py loads, or of an MPIComm built under torchrun: each process a world of its own, training by
    itself in silence), raise at ``compcoll.init()`` or ``MPIComm()`` naming the launcher's count and what to launch
    with. Here the launchers' variables are set on processes started without one, which MPI makes worlds of one as a
    foreign launcher's; ``test_open_mpi.py`` runs the real mismatch (MPICH's mpiexec starting ranks whose mpi4py
    loads Open MPI)."""
    script = ("import sys, compcoll\n"
              "try:\n"
              "    getattr(compcoll, sys.argv[1])()\n"
              "except RuntimeError as error:\n"
              "    print(error)\n"
              "else:\n"
              "    print('trained alone')\n")
    for make, launched, said, hint in (
            ("init", {"PMI_SIZE": "2"}, "started 2 processes (PMI_SIZE=2)", "the mpiexec of the MPI"),
            ("init", {"SLURM_NTASKS": "3", "SLURM_STEP_NUM_TASKS": "3"}, "started 3 processes (SLURM_STEP_NUM_TASKS=3)",
             "srun --mpi=pmi2"),
            ("MPIComm", {"WORLD_SIZE": "4", "MASTER_ADDR": "127.0.0.1", "RANK": "0"},
             "started 4 processes (WORLD_SIZE=4)", "under torchrun, compcoll.init() opens torch.distributed")):
        done = subprocess.run([sys.executable, "-c", script, make], capture_output=True, text=True, timeout=120,
                              env={**os.environ, **launched})
        assert done.returncode == 0 and f"compcoll: the launcher {said}, but MPI's COMM_WORLD holds this one alone" \
            in done.stdout and hint in done.stdout, done.stdout + done.stderr


def test_only_a_world_of_one_against_a_launcher_of_several_is_refused() -> None:
    from compcoll.comm.mpi import check_world

    for world, env in ((1, {}), (1, {"PMI_SIZE": "1"}), (2, {"PMI_SIZE": "2"}), (3, {"OMPI_COMM_WORLD_SIZE": "2"}),
                       (1, {"SLURM_NTASKS": "4"}), (1, {"PMI_SIZE": ""}), (1, {"WORLD_SIZE": "2"})):
        check_world(world, "MPI", env)  # sbatch's and salloc's SLURM_NTASKS alone start no process, nor WORLD_SIZE
        # without a rendezvous
    with pytest.raises(RuntimeError, match=r"started 4 processes \(OMPI_COMM_WORLD_SIZE=4\)"):
        check_world(1, "MPI", {"OMPI_COMM_WORLD_SIZE": "4", "SLURM_STEP_NUM_TASKS": "2"})
    # an MPIComm built by hand in a process torchrun started inside an srun step (PMI_SIZE=2, the step's): torchrun's
    # count and its hint, not the step's and mpiexec
    with pytest.raises(RuntimeError, match=r"started 4 processes \(WORLD_SIZE=4\).*under torchrun, compcoll.init"):
        check_world(1, "MPI", {"PMI_SIZE": "2", "WORLD_SIZE": "4", "MASTER_ADDR": "h", "TORCHELASTIC_RUN_ID": "r"})
