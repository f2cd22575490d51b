"""What the installed torch offers, for the tests of what needs more than pyproject's floor (torch 2.6)."""

from __future__ import annotations

import pytest
import torch
from torch.distributed.fsdp._fully_shard import _fsdp_api

FSDP_COMPRESSES = hasattr(_fsdp_api, "ReduceScatter")
"""Whether FSDP2 takes a custom reduce-scatter (torch 2.9 and newer), which ``compcoll.fsdp`` needs."""
WHY_NO_FSDP = "compcoll.fsdp needs torch 2.9 or newer"
"""Why a test or a doc block of ``compcoll.fsdp`` is skipped where ``FSDP_COMPRESSES`` is False."""
NEEDS_FSDP_HOOK = pytest.mark.skipif(not FSDP_COMPRESSES, reason=WHY_NO_FSDP)
"""The mark of a test of ``compcoll.fsdp``."""
GLOO_POOLS = tuple(int(part) for part in torch.__version__.split(".")[:2]) >= (2, 8)
"""Whether Gloo ranks may be pooled (``tests/pool.py``): under torch 2.6 and 2.7 a pooled Gloo rank now and then stays
in the destructor of a case's process group and the case times out (each passes on ranks of its own)."""
