"""MPIComm with device buffers: CUDA-awareness detection, and both device paths exercised on host memory."""

from __future__ import annotations

import pytest

from compcoll.comm.cuda_aware import detect_cuda_aware, loaded_mpi_libraries
from tests.pool import run


@pytest.mark.parametrize("cuda_aware", [True, False])
@pytest.mark.parametrize("world_size", [1, 2, 3])
def test_device_paths_move_the_right_bytes(cuda_aware: bool, world_size: int) -> None:
    run("tests.comm.device_workers:device_paths", world_size, "mpi", args=(cuda_aware,))


def test_detection_reads_the_loaded_library_and_the_override(monkeypatch: pytest.MonkeyPatch) -> None:
    from mpi4py import MPI

    assert any("libmpi" in path for path in loaded_mpi_libraries()), MPI.Get_library_version()
    monkeypatch.delenv("COMPCOLL_CUDA_AWARE", raising=False)
    assert detect_cuda_aware() is False  # the mpich wheel is built without CUDA
    monkeypatch.setenv("COMPCOLL_CUDA_AWARE", "1")
    assert detect_cuda_aware() is True
    monkeypatch.setenv("COMPCOLL_CUDA_AWARE", "maybe")
    with pytest.raises(ValueError, match="COMPCOLL_CUDA_AWARE"):
        detect_cuda_aware()
