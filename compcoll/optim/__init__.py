"""Optimizers that do their own compressed communication (1-bit Adam, 1-bit LAMB, 0/1 Adam, Birder) and their GradScaler."""

from .amp import GradScaler
from .base import CompressedOptimizer
from .birder import Birder
from .onebit_adam import OneBitAdam
from .onebit_lamb import OneBitLamb
from .zero_one_adam import ZeroOneAdam

__all__ = ["Birder", "CompressedOptimizer", "GradScaler", "OneBitAdam", "OneBitLamb", "ZeroOneAdam"]
