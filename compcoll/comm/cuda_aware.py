"""Whether the loaded MPI moves CUDA memory itself: ``MPIX_Query_cuda_support`` through ctypes, or an override."""

from __future__ import annotations

import ctypes
import os

CUDA_AWARE_ENV = "COMPCOLL_CUDA_AWARE"


def loaded_mpi_libraries() -> list[str]:
    """Paths of the libmpi shared objects mapped into this process (after mpi4py has loaded MPI)."""
    try:
        with open("/proc/self/maps") as maps:
            paths = {fields[-1] for fields in map(str.split, maps) if len(fields) >= 6}
    except OSError:
        return []
    return sorted(p for p in paths if os.path.basename(p).startswith("libmpi") and ".so" in p)


def detect_cuda_aware() -> bool:
    """``COMPCOLL_CUDA_AWARE`` (1 / 0) if set; else what the loaded libmpi's ``MPIX_Query_cuda_support()`` says.

    1. The environment override wins (for MPI builds that support CUDA but cannot say so).
    2. Each libmpi mapped into the process is opened with ctypes; the first that exports
       ``MPIX_Query_cuda_support`` (Open MPI, MPICH >= 4) is asked at run time.
    3. No such symbol, or no library found: not CUDA-aware (device buffers are staged).
    """
    value = os.environ.get(CUDA_AWARE_ENV)
    if value is not None:
        if value.strip().lower() not in ("0", "1", "true", "false", "yes", "no"):
            raise ValueError(f"{CUDA_AWARE_ENV}={value!r}: use 1 or 0")
        return value.strip().lower() in ("1", "true", "yes")
    for path in loaded_mpi_libraries():
        try:
            query = getattr(ctypes.CDLL(path), "MPIX_Query_cuda_support")
        except (OSError, AttributeError):
            continue
        query.restype = ctypes.c_int
        query.argtypes = []
        return bool(query())
    return False
