"""What the launchers' environment variables say: whether torchrun or an MPI launcher started the job, and how many."""

from __future__ import annotations

from collections.abc import Mapping

MPI_SIZE_VARS = ("PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "PMIX_SIZE")
"""The processes an MPI launcher started (MPICH's Hydra and PMI, Open MPI's mpiexec, PMIx)."""
SRUN_SIZE_VAR = "SLURM_STEP_NUM_TASKS"
"""The processes of an srun job step (set by srun for each of them, not by sbatch or salloc)."""
TORCH_SIZE_VAR = "WORLD_SIZE"
"""The processes of a torch.distributed launch (torchrun's), counted where ``MASTER_ADDR`` is set beside it."""
TORCHRUN_VAR = "TORCHELASTIC_RUN_ID"
"""Set by torchrun (torch.distributed.elastic) in every process it starts (``dist.is_torchelastic_launched``)."""


def launched_by_torchrun(env: Mapping[str, str]) -> bool:
    """Whether torchrun started this process: then it is the launcher nearest to the process, whatever MPI variables
    an outer one left in ``env`` (Slurm's pmi2 and cray_shasta plugins export ``PMI_SIZE`` to every task of a step,
    so ``srun torchrun ...`` hands each worker the step's count)."""
    return TORCHRUN_VAR in env


def launched_size(env: Mapping[str, str]) -> tuple[str, int] | None:
    """How many processes the launcher of this one started: (the variable, its number), or None.

    The first of ``MPI_SIZE_VARS``, ``SRUN_SIZE_VAR`` and (with ``MASTER_ADDR``) ``TORCH_SIZE_VAR`` that ``env`` sets
    to a number: an MPI launcher's own count first, as it is the one that started this process where several are
    set (mpiexec inside an srun allocation), except in a process torchrun started (``launched_by_torchrun``), whose
    own count comes first.
    """
    torch_names = (TORCH_SIZE_VAR,) if "MASTER_ADDR" in env else ()
    mpi_names = (*MPI_SIZE_VARS, SRUN_SIZE_VAR)
    names = (*torch_names, *mpi_names) if launched_by_torchrun(env) else (*mpi_names, *torch_names)
    for name in names:
        count = _count(env, name)
        if count is not None:
            return name, count
    return None


def launched_by_mpi(env: Mapping[str, str], names: tuple[str, ...] = MPI_SIZE_VARS) -> bool:
    """Whether any of ``names`` in ``env`` says a launcher started more than one process (a value that is no number
    says nothing, as for ``launched_size``)."""
    return any((_count(env, name) or 1) > 1 for name in names)


def _count(env: Mapping[str, str], name: str) -> int | None:
    """The number ``env`` sets ``name`` to (blanks around it allowed), or None where it sets no number."""
    value = env.get(name, "").strip()
    return int(value) if value.isdigit() else None
