"""Optimizers the engine builds from ``config.optimizer`` (torch, Lion, kernel-provider offload)."""

from ds.zero.optim.build import OptimizerFactory
from ds.zero.optim.lion import Lion

__all__ = ["Lion", "OptimizerFactory"]
