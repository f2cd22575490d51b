"""Rank side of the test pool (``tests/pool.py``): real ranks that run one test body after another."""

from __future__ import annotations

import contextlib
import importlib
import io
import json
import os
import time
import traceback
from pathlib import Path

import compcoll

POLL_S = (0.001, 0.05)
"""How often an idle rank looks for the next case: from the first value, doubling up to the second."""


def serve(comm: compcoll.Communicator, directory: str) -> None:
    """Run the cases the test process writes into ``directory`` until it writes ``stop``.

    1. Wait for ``<k>.case`` (JSON: target, args, environment), case k = 0, 1, ...
    2. Set the case's environment variables (restored after it), and run
       ``target(fresh, *args)`` on a communicator of its own over the same ranks
       (an MPI communicator duplicated from this one, or a new torch.distributed group),
       made the default, with this rank's standard output captured.
    3. Release the case's communicator if the case passed (one that failed may have
       operations pending; it is left alone), write ``<k>.<rank>.result`` (JSON: the
       traceback or None, the output), and go on to case k + 1.
    """
    base = Path(directory)
    case = 0
    while _wait_for(base / f"{case}.case", base / "stop"):
        request = json.loads((base / f"{case}.case").read_text())
        module_name, func_name = request["target"].split(":")
        saved = {key: os.environ.get(key) for key in request["env"]}
        os.environ.update(request["env"])
        fresh = _fresh(comm)
        compcoll.set_default(fresh)
        output = io.StringIO()
        try:
            with contextlib.redirect_stdout(output):
                getattr(importlib.import_module(module_name), func_name)(fresh, *request["args"])
            error = None
        except BaseException:  # noqa: BLE001 - every failure goes back to the test, which raises it
            error = traceback.format_exc()
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        if error is None:
            _release(fresh)
        written = base / f"{case}.{comm.rank}.tmp"
        written.write_text(json.dumps({"error": error, "output": output.getvalue()}))
        written.rename(base / f"{case}.{comm.rank}.result")
        case += 1


def _wait_for(request: Path, stop: Path) -> bool:
    """Whether ``request`` appeared (True) or ``stop`` did (False)."""
    pause = POLL_S[0]
    while not request.exists():
        if stop.exists():
            return False
        time.sleep(pause)
        pause = min(2 * pause, POLL_S[1])
    return True


def _fresh(comm: compcoll.Communicator) -> compcoll.Communicator:
    """A communicator of the same ranks that no earlier case used."""
    if hasattr(comm, "mpi_comm"):  # MPIComm (an isinstance check would import mpi4py on Gloo ranks)
        return compcoll.MPIComm(comm.mpi_comm.Dup())
    import torch.distributed as dist

    return compcoll.TorchComm(dist.new_group(list(range(comm.size))))


def _release(comm: compcoll.Communicator) -> None:
    """Free a case's communicator (MPI context ids and Gloo sockets are finite)."""
    if hasattr(comm, "mpi_comm"):
        comm.mpi_comm.Free()
        return
    import torch.distributed as dist

    dist.destroy_process_group(comm.group)


def says_its_rank(comm: compcoll.Communicator) -> None:
    """Prints this rank and the size of its communicator (``tests/test_pool.py``)."""
    comm.barrier()
    print(f"rank {comm.rank} of {comm.size}")


def fails_on(comm: compcoll.Communicator, rank: int) -> None:
    """Raises on ``rank`` only (``tests/test_pool.py``)."""
    if comm.rank == rank:
        raise RuntimeError(f"case failed on rank {rank} on purpose")


def ends_a_rank(comm: compcoll.Communicator) -> None:
    """The last rank's process ends (``tests/test_pool.py``)."""
    if comm.rank == comm.size - 1:
        os._exit(3)


def says_its_timeout(comm: compcoll.Communicator) -> None:
    """Prints the communicator's timeout and ``COMPCOLL_RANKS_PER_NODE`` (``tests/test_pool.py``)."""
    print(f"timeout {comm.timeout:g} ranks per node {os.environ.get('COMPCOLL_RANKS_PER_NODE')}")
