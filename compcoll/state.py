"""Error-feedback buffers kept per key for one rank, with state_dict / load_state_dict."""

from __future__ import annotations

from typing import Any, Hashable

import torch

from .spec import padded_numel


class ErrorFeedbackState:
    """The worker and server error buffers of one rank, one pair per key.

    Buffers start at zero the first time a key is seen, sized for the tensor and the
    world size. ``state_dict()`` holds them (this rank's share: save one per rank) and
    ``load_state_dict()`` restores them; a checkpoint from another world size or rank is
    refused, since its server errors belong to other chunks.
    """

    def __init__(self, rank: int, world_size: int) -> None:
        self.rank = rank
        self.world_size = world_size
        self.buffers: dict[Hashable, tuple[torch.Tensor, torch.Tensor]] = {}

    def get(self, key: Hashable, tensor: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(worker_error, server_error) for ``key``, created as zeros for ``tensor``'s size.

        Raises ValueError when ``key`` was used before with another number of elements.
        """
        full = padded_numel(tensor.numel(), self.world_size)
        pair = self.buffers.get(key)
        if pair is None:
            pair = (
                torch.zeros(full, dtype=torch.float32, device=tensor.device),
                torch.zeros(full // self.world_size, dtype=torch.float32, device=tensor.device),
            )
            self.buffers[key] = pair
        elif pair[0].numel() != full:
            raise ValueError(
                f"error-feedback key {key!r} holds buffers for {pair[0].numel()} padded elements, "
                f"but this tensor needs {full}; use a new key for a tensor of another size"
            )
        return pair

    def state_dict(self) -> dict[str, Any]:
        """Everything needed to resume: world size, rank and every key's two buffers (copies)."""
        return {
            "world_size": self.world_size,
            "rank": self.rank,
            "buffers": {k: {"worker_error": w.clone(), "server_error": s.clone()} for k, (w, s) in self.buffers.items()},
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore buffers saved by ``state_dict()`` on the same rank of a same-size world."""
        if state["world_size"] != self.world_size or state["rank"] != self.rank:
            raise ValueError(
                f"error-feedback checkpoint is from rank {state['rank']} of {state['world_size']}, "
                f"this is rank {self.rank} of {self.world_size}: server errors belong to per-rank "
                f"chunks, so resume with the same world size and each rank's own state"
            )
        self.buffers = {
            k: (v["worker_error"].to(torch.float32).clone(), v["server_error"].to(torch.float32).clone())
            for k, v in state["buffers"].items()
        }
