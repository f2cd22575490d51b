"""What a local MPI job that ends badly can leave on this machine: MPICH's shared-memory segments, Hydra's files."""

from __future__ import annotations

import glob

from compcoll.comm.segments import MPICH_SEGMENT_PREFIX

HYDRA_TOPOLOGY_FILES = "/tmp/hydra_hwloc_xmlfile_*"
"""The topology file each mpiexec (MPICH's Hydra) writes for its proxies, and removes at its end unless killed."""


def segments() -> set[str]:
    """The MPICH shared-memory segments on this machine."""
    return set(glob.glob(MPICH_SEGMENT_PREFIX + "*"))


def topology_files() -> set[str]:
    """Hydra's topology files on this machine."""
    return set(glob.glob(HYDRA_TOPOLOGY_FILES))
