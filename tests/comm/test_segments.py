"""MPICH's segment names: which a process maps (read from its memory map), and released by launched MPI ranks."""

from __future__ import annotations

from pathlib import Path

from compcoll.comm.segments import mapped_segments
from tests.pool import run


def test_mapped_segments_lists_the_live_mpich_files_of_a_memory_map(tmp_path: Path) -> None:
    maps = tmp_path / "maps"
    maps.write_text(
        "7f00a0000000-7f00a0200000 rw-s 00000000 00:1a 1049 /dev/shm/mpich_shm_3afa49a7_0\n"
        "7f00a0200000-7f00a0400000 rw-s 00000000 00:1a 1049 /dev/shm/mpich_shm_3afa49a7_0\n"
        "7f00a0400000-7f00a0401000 rw-s 00000000 00:1a 1050 /dev/shm/mpich_shm_0badf00d_0 (deleted)\n"
        "7f00a0401000-7f00a0402000 rw-s 00000000 00:1a 1051 /dev/shm/vader_segment.host.1\n"
        "7f00a0402000-7f00a0403000 r-xp 00000000 08:01 2002 /usr/lib/libmpi.so.12 mpich_shm_ in a path\n"
        "7ffd10000000-7ffd10021000 rw-p 00000000 00:00 0 [stack]\n")
    assert mapped_segments(str(maps)) == ["/dev/shm/mpich_shm_3afa49a7_0"]
    assert mapped_segments(str(tmp_path / "absent")) == []


def maps_no_named_segment(comm) -> None:
    """Every launched MPI rank, after a collective: it maps no MPICH segment whose name still exists."""
    comm.barrier()
    assert mapped_segments() == [], mapped_segments()


def test_launched_mpi_ranks_map_no_named_segment() -> None:
    run("tests.comm.test_segments:maps_no_named_segment", 3, "mpi", timeout=120)
