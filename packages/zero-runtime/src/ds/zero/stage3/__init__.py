"""ZeRO stage 3: per-parameter partitioning, gather/release hooks with prefetch, offload."""

from ds.zero.stage3.collectives import Collectives, ModuleOrderError
from ds.zero.stage3.optimizer import Stage3Optimizer
from ds.zero.stage3.partitioner import Accounting, Stage3Limits, Stage3Partitioner
from ds.zero.stage3.shard import ParamStatus, ShardState, is_partitioned, shard_of
from ds.zero.stage3.strategy import Stage3Strategy
from ds.zero.stage3.swap import AioSettings

__all__ = [
    "Accounting",
    "AioSettings",
    "Collectives",
    "ModuleOrderError",
    "ParamStatus",
    "ShardState",
    "Stage3Limits",
    "Stage3Optimizer",
    "Stage3Partitioner",
    "Stage3Strategy",
    "is_partitioned",
    "shard_of",
]
