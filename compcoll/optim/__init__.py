"""Optimizers that do their own compressed communication: 1-bit Adam, 1-bit LAMB, 0/1 Adam, Birder.

Beside them: their GradScaler, the broadcast of a model's buffers, their builder from DeepSpeed configs, schedules
and checkpoints, and torch Adam's state carried into 1-bit Adam and back.
"""

from .amp import GradScaler
from .base import CompressedOptimizer
from .birder import Birder
from .buffers import broadcast_buffers
from .carry import load_torch_adam_state, torch_adam_state
from .from_deepspeed import from_deepspeed_config, load_deepspeed_checkpoint, scheduler_from_deepspeed_config
from .onebit_adam import OneBitAdam
from .onebit_lamb import OneBitLamb
from .zero_one_adam import ZeroOneAdam

__all__ = ["Birder", "CompressedOptimizer", "GradScaler", "OneBitAdam", "OneBitLamb", "ZeroOneAdam",
           "broadcast_buffers", "from_deepspeed_config", "load_deepspeed_checkpoint", "load_torch_adam_state",
           "scheduler_from_deepspeed_config", "torch_adam_state"]
