"""ds.integrations.lightning: PyTorch Lightning strategies backed by ds.

Importing this module registers ``ds_zero1``, ``ds_zero2``, ``ds_zero3`` and ``ds_zero3_offload``
in Lightning's strategy registry (Trainer) and in Fabric's, so ``Trainer(strategy="ds_zero3")``
works after ``import ds.integrations.lightning``.
"""

from ds.integrations.lightning.strategy import STRATEGIES, DsStrategy, ModuleWrapper
from lightning.pytorch.strategies import StrategyRegistry

DsStrategy.register_strategies(StrategyRegistry)

__all__ = ["STRATEGIES", "DsStrategy", "ModuleWrapper"]
