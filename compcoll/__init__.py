"""compcoll: compressed collectives (error-compensated and hierarchical 1-bit allreduce, low-bit reduce-scatter) for data-parallel training."""

from .algorithms.hierarchical import (
    hierarchical_allreduce,
    hierarchical_compressed_allreduce,
    hierarchical_error_numels,
)
from .algorithms.onebit import CompressedAllreduce, compressed_allreduce
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


def __getattr__(name: str):
    if name in ("MPIComm", "TorchComm"):
        from . import comm

        return getattr(comm, name)
    raise AttributeError(f"module 'compcoll' has no attribute {name!r}")
