"""ds.integrations.lightning: PyTorch Lightning strategies backed by ds.

Importing this module registers ``ds_zero1``, ``ds_zero2``, ``ds_zero3`` and ``ds_zero3_offload``
in Lightning's strategy registry (Trainer) and in Fabric's, so ``Trainer(strategy="ds_zero3")`` and
``Fabric(strategy="ds_zero3")`` work after ``import ds.integrations.lightning``.
"""

from ds.integrations.lightning._engine import STRATEGIES
from ds.integrations.lightning.fabric import DsFabricStrategy
from ds.integrations.lightning.strategy import DsStrategy, ModuleWrapper
from lightning.fabric.strategies import STRATEGY_REGISTRY
from lightning.pytorch.strategies import StrategyRegistry

DsStrategy.register_strategies(StrategyRegistry)
DsFabricStrategy.register_strategies(STRATEGY_REGISTRY)

__all__ = ["STRATEGIES", "DsFabricStrategy", "DsStrategy", "ModuleWrapper"]
