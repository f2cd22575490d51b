"""Compressed gradient communication for FSDP2 (``fully_shard``): ``state = compcoll.fsdp.compress(model)``."""

from .replicas import ReplicaState
from .scatter import ReduceScatterState, compress

__all__ = ["ReduceScatterState", "ReplicaState", "compress"]
