"""An uncaught exception on one MPI rank ends the whole job at once, as ``python -m mpi4py`` makes it."""

from __future__ import annotations

import os
import sys
import time
from types import TracebackType

from .segments import unlink_mapped_segments

ABORT_ENV = "COMPCOLL_MPI_ABORT"
FORWARD_SECONDS = 0.2
"""Pause between the message and MPI_Abort: the launcher forwards a rank's output through its proxy, and an
abort can drop lines still in flight (the traceback arrived without the line after it in 1 of many CI runs)."""
_installed = False


def install_abort_hook() -> bool:
    """Make an uncaught exception abort the MPI job (once per process; ``COMPCOLL_MPI_ABORT=0`` opts out).

    Under mpiexec, a rank that dies of an uncaught exception stays in MPI_Finalize at
    exit, waiting for peers that wait for it in their next collective until their
    timeout (5 minutes by default): the job runs on, doing nothing. With the hook:
    1. the traceback is printed as before (the previous ``sys.excepthook``);
    2. a line saying so, and a pause of ``FORWARD_SECONDS`` for the launcher to forward the output;
    3. unlink the name of MPICH's shared-memory segment (``segments.unlink_mapped_segments``): MPI_Abort ends every
       rank of the job without MPI_Finalize, which alone unlinks it, and left its 2 MiB in ``/dev/shm`` each time;
    4. ``MPI_Abort(COMM_WORLD, 1)``: the launcher ends every rank.
    ``KeyboardInterrupt`` and ``SystemExit`` keep their usual meaning. torchrun needs
    nothing of the kind: it ends the job when one process exits with an error.

    Returns whether the hook is installed.
    """
    global _installed
    if _installed or os.environ.get(ABORT_ENV, "1") == "0":
        return _installed
    previous = sys.excepthook

    def hook(kind: type[BaseException], value: BaseException, tb: TracebackType | None) -> None:
        previous(kind, value, tb)
        if issubclass(kind, Exception):
            from mpi4py import MPI

            sys.stderr.write(f"compcoll: uncaught {kind.__name__} on MPI rank {MPI.COMM_WORLD.Get_rank()}; "
                             f"aborting the job ({ABORT_ENV}=0 to keep the ranks running)\n")
            sys.stderr.flush()
            time.sleep(FORWARD_SECONDS)
            unlink_mapped_segments()
            MPI.COMM_WORLD.Abort(1)

    sys.excepthook = hook
    _installed = True
    return True
