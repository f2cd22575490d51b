"""Rank-side bodies of the MPIComm device-path tests: host tensors routed as if they were CUDA tensors."""

from __future__ import annotations

import compcoll
from compcoll.comm.mpi import MPIComm
from tests.algorithms.onebit_workers import numerics
from tests.comm.comm_workers import collectives


class HostAsDevice(MPIComm):
    """MPIComm that treats host tensors as device tensors, so the CUDA-aware path (pointers handed
    to MPI through ``__cuda_array_interface__``, as mpi4py's own tests do on host memory) and the
    staged path (copies through host buffers) run on a machine without a GPU."""

    def _is_device(self, tensor) -> bool:
        return True


def device_paths(comm: compcoll.Communicator, cuda_aware: bool) -> None:
    """Every collective, and compressed_allreduce against the reference, through the device path (over the case's
    communicator, which is the job: ``tests.pool_workers._fresh``)."""
    device = HostAsDevice(comm.mpi_comm, cuda_aware=cuda_aware)
    device.job_rank, device.job_size = comm.job_rank, comm.job_size
    collectives(device)
    numerics(device, [[37], [3, 7, 11], [12289]], 2)
    assert (device.staged_bytes > 0) != cuda_aware, f"staged {device.staged_bytes} bytes (cuda_aware={cuda_aware})"
