"""``deepspeed.runtime.zero.offload_config``: the offload sections of ``zero_optimization`` and
the enums of ``engine.offload_states()``."""

from __future__ import annotations

from ds.full.compat.deepspeed.runtime.zero.config import (
    DeepSpeedZeroOffloadOptimizerConfig,
    DeepSpeedZeroOffloadParamConfig,
)
from ds.zero.offload_states import OffloadDeviceEnum, OffloadStateTypeEnum

__all__ = [
    "DeepSpeedZeroOffloadOptimizerConfig",
    "DeepSpeedZeroOffloadParamConfig",
    "OffloadDeviceEnum",
    "OffloadStateTypeEnum",
]
