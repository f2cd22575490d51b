"""Run example scripts one after another in the ranks of one launch, then print each script's output by rank.

Usage (what ``tests/test_examples.py`` runs): ``mpiexec -n 2 python -m tests.example_batch "a.py --x 1" b.py ...``,
or the same under ``torchrun``. Each argument is a script and its own arguments, split as a shell would.
1. Each script runs as ``__main__`` (``runpy``) with its arguments as ``sys.argv``, its standard output kept
   apart per rank.
2. After it ends, rank 0 gathers every rank's output and prints it under a ``MARK`` line, ranks in
   order, so a test reads one script's lines alone, as a launch of that script alone would print
   them (less the interleaving). The gather goes over MPI, or under torchrun over the process group the
   first script's ``compcoll.init`` started.
3. Under torchrun the process group lives until the last script ends: a group destroyed at the end of one
   script (``compcoll.shutdown``) cannot be started again in the same launch (the second rendezvous on
   torchrun's store never completes), so destroying the whole group is put off until then; the later
   scripts' ``compcoll.init`` finds it.
4. A script that raises prints what it had written before the exception goes on (compcoll's
   abort hook then ends an MPI job; torchrun ends the others when a rank fails).
"""

from __future__ import annotations

import contextlib
import io
import os
import runpy
import shlex
import sys
from typing import Iterator

MARK = "=== tests.example_batch: "
"""The line in front of each script's output."""


def main(entries: list[str]) -> None:
    with _group_kept_to_the_end() if "TORCHELASTIC_RUN_ID" in os.environ else contextlib.nullcontext():
        _run(entries)


def _run(entries: list[str]) -> None:
    for entry in entries:
        script, *arguments = shlex.split(entry)
        captured = io.StringIO()
        sys.argv = [script, *arguments]
        try:
            with contextlib.redirect_stdout(captured):
                runpy.run_path(script, run_name="__main__")
        except BaseException:
            sys.stdout.write(captured.getvalue())
            raise
        outputs = _gather(captured.getvalue())
        if outputs is not None:
            print(f"{MARK}{entry}")
            print("".join(outputs), end="", flush=True)


@contextlib.contextmanager
def _group_kept_to_the_end() -> Iterator[None]:
    """``torch.distributed.destroy_process_group()`` of the whole group does nothing inside; on leaving, the
    group is destroyed (one of its subgroups is destroyed when asked)."""
    import torch.distributed as dist

    destroy = dist.destroy_process_group
    dist.destroy_process_group = lambda group=None: None if group is None else destroy(group)
    try:
        yield
    finally:
        dist.destroy_process_group = destroy
        if dist.is_initialized():
            destroy()


def _gather(text: str) -> list[str] | None:
    """Every rank's ``text`` on rank 0, in rank order (None on the others): over torch.distributed where it is
    initialised, else over MPI (imported here, not at import: the tests import ``MARK`` without starting MPI)."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        gathered = [None] * dist.get_world_size() if dist.get_rank() == 0 else None
        dist.gather_object(text, gathered, dst=0)
        return gathered
    from mpi4py import MPI

    return MPI.COMM_WORLD.gather(text, root=0)


if __name__ == "__main__":
    main(sys.argv[1:])
