"""DDP communication hooks: error-compensated 1-bit, Birder's hierarchical 1-bit, and local gradients."""

from .birder import BirderState, birder_hook
from .local import local_hook
from .onebit import OneBitState, onebit_hook

__all__ = ["BirderState", "OneBitState", "birder_hook", "local_hook", "onebit_hook"]

# The hook modules leave out ``from __future__ import annotations``: DDP checks a hook's annotations
# against the classes themselves (``dist.GradBucket``, ``torch.futures.Future[torch.Tensor]``).
