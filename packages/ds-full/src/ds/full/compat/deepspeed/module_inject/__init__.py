"""``deepspeed.module_inject``: AutoTP (tensor-parallel layers from layer specs or a
transformers plan, :mod:`ds.parallel.tp`) and AutoEP (:mod:`ds.parallel.moe`)."""

from ds.full.compat.deepspeed.module_inject.autotp_config import (
    AutoTPConfig,
    AutoTPPresets,
    PartitionType,
    TPLayerSpec,
    merge_autotp_configs,
)
from ds.full.compat.deepspeed.module_inject.layers import (
    LinearAllreduce,
    LinearLayer,
    set_autotp_mode,
)

__all__ = [
    "AutoTPConfig",
    "AutoTPPresets",
    "LinearAllreduce",
    "LinearLayer",
    "PartitionType",
    "TPLayerSpec",
    "merge_autotp_configs",
    "set_autotp_mode",
]
