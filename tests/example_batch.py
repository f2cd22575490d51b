"""Run example scripts one after another in the ranks of one launch, then print each script's output by rank.

Usage (what ``tests/test_examples.py`` runs): ``mpiexec -n 2 python -m tests.example_batch a.py b.py ...``.
1. Each script runs as ``__main__`` (``runpy``), its standard output kept apart per rank.
2. After it ends, rank 0 gathers every rank's output and prints it under a ``MARK`` line, ranks in
   order, so a test reads one script's lines alone, as a launch of that script alone would print
   them (less the interleaving).
3. A script that raises prints what it had written before the exception goes on (compcoll's
   abort hook then ends the job).
"""

from __future__ import annotations

import contextlib
import io
import runpy
import sys

MARK = "=== tests.example_batch: "
"""The line in front of each script's output."""


def main(scripts: list[str]) -> None:
    from mpi4py import MPI  # here, not at import: the tests import MARK without starting MPI

    world = MPI.COMM_WORLD
    for script in scripts:
        captured = io.StringIO()
        sys.argv = [script]
        try:
            with contextlib.redirect_stdout(captured):
                runpy.run_path(script, run_name="__main__")
        except BaseException:
            sys.stdout.write(captured.getvalue())
            raise
        outputs = world.gather(captured.getvalue(), root=0)
        if world.rank == 0:
            print(f"{MARK}{script}")
            print("".join(outputs), end="", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
