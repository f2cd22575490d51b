"""The name of MPICH's shared-memory segment, released once a node's launched ranks have mapped it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

MPICH_SEGMENT_PREFIX = "/dev/shm/mpich_shm_"
"""MPICH maps one such file on each node in MPI_Init, and unlinks it only in MPI_Finalize."""


def mapped_segments(maps: str = "/proc/self/maps") -> list[str]:
    """The MPICH segment files this process maps whose names still exist (none where ``maps`` cannot be read)."""
    try:
        lines = Path(maps).read_text().splitlines()
    except OSError:
        return []
    names = {line.split(maxsplit=5)[5] for line in lines if MPICH_SEGMENT_PREFIX in line}
    return sorted(name for name in names if name.startswith(MPICH_SEGMENT_PREFIX) and not name.endswith("(deleted)"))


def unlink_mapped_segments() -> list[str]:
    """Unlink the names of the MPICH segments this process maps (``mapped_segments``); returns them."""
    names = mapped_segments()
    for name in names:
        Path(name).unlink(missing_ok=True)
    return names


def release_mpich_segment(mpi_comm: Any) -> list[str]:
    """Unlink the name of MPICH's segment on this node once every rank there has mapped it.

    A rank that ends without MPI_Finalize (``compcoll.launcher``'s failed rank leaves with ``os._exit``, a rank past
    its timeout is killed, MPI_Abort ends the others) leaves the file behind: 2 MiB of memory each, in a
    ``/dev/shm`` that containers often cap at 64 MiB. So, as for any shared segment once all its users hold it:
    1. split ``mpi_comm`` by shared memory and wait for the node's ranks: all are past MPI_Init, so have mapped it;
    2. the node's first rank unlinks each MPICH segment it maps (``unlink_mapped_segments``). The memory lives on
       until its last rank unmaps it; MPI_Finalize finds no name to unlink and says nothing.
    Collective over ``mpi_comm``. Returns the names this rank unlinked.
    """
    from mpi4py import MPI

    node = mpi_comm.Split_type(MPI.COMM_TYPE_SHARED)
    try:
        node.Barrier()
        names = unlink_mapped_segments() if node.Get_rank() == 0 else []
    finally:
        node.Free()
    return names
