"""compcoll: compressed collectives (flat and hierarchical 1-bit allreduce, low-bit reduce-scatter) for training."""

import importlib
from typing import Any

from .algorithms.birder import hierarchical_allreduce
from .algorithms.hierarchical import hierarchical_compressed_allreduce, hierarchical_error_numels
from .algorithms.keyed import CompressedAllreduce
from .algorithms.onebit import compressed_allreduce
from .algorithms.plan import ErrorFeedback
from .algorithms.reduce_scatter import compressed_reduce_scatter
from .comm import Communicator, SingleComm, get_default, init, set_default, shutdown
from .comm.topology import Topology, topology
from .errors import (
    CollectiveTimeout, CommunicatorBroken, CompcollError, NonFiniteError, RankMismatchError, RemoteError,
)
from .spec import padded_numel

__version__ = "0.1.0"

__all__ = [
    "CollectiveTimeout",
    "CommunicatorBroken",
    "CompcollError",
    "CompressedAllreduce",
    "Communicator",
    "ErrorFeedback",
    "MPIComm",
    "NonFiniteError",
    "RankMismatchError",
    "RemoteError",
    "SingleComm",
    "TorchComm",
    "Topology",
    "compressed_allreduce",
    "compressed_reduce_scatter",
    "get_default",
    "hierarchical_allreduce",
    "hierarchical_compressed_allreduce",
    "hierarchical_error_numels",
    "init",
    "padded_numel",
    "set_default",
    "shutdown",
    "topology",
]


SUBPACKAGES = ("algorithms", "bench", "checkpoint", "codecs", "comm", "ddp", "eager", "errors", "fsdp",
               "integrations", "kernels", "launcher", "optim", "spec", "warmup", "workspace")
"""What ``compcoll.<name>`` reaches after a plain ``import compcoll`` (``__getattr__``)."""


def __getattr__(name: str) -> Any:
    """``MPIComm`` and ``TorchComm``, and every subpackage (``compcoll.ddp.onebit_hook``, ``compcoll.optim``, ...) as
    ``import torch; torch.distributed`` reaches torch's: each imported at its first use, so ``import compcoll`` stays
    as quick as before (``compcoll.fsdp`` needs torch 2.9 and says so then)."""
    if name in ("MPIComm", "TorchComm"):
        from . import comm

        return getattr(comm, name)
    if name in SUBPACKAGES:
        return importlib.import_module(f".{name}", __name__)
    raise AttributeError(f"module 'compcoll' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(SUBPACKAGES) | {"MPIComm", "TorchComm"})
