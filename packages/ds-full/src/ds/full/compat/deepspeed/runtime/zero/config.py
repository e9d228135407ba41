"""``deepspeed.runtime.zero.config``: ``DeepSpeedZeroConfig`` is ds's ``zero_optimization`` model
(DeepSpeed's field names, ``stage3_*`` aliases and defaults), ``ZeroStageEnum`` the stages."""

from __future__ import annotations

from enum import IntEnum
from typing import Any

from ds.zero.config.sections import OffloadOptimizerConfig, OffloadParamConfig
from ds.zero.config.sections import ZeroConfig as DeepSpeedZeroConfig


class ZeroStageEnum(IntEnum):
    disabled = 0
    optimizer_states = 1
    gradients = 2
    weights = 3
    max_stage = 3


def get_zero_config(param_dict: dict[str, Any]) -> DeepSpeedZeroConfig:
    section = param_dict.get("zero_optimization", {})
    if isinstance(section, bool):  # the old "zero_optimization": true form
        section = {"stage": 1 if section else 0}
    return DeepSpeedZeroConfig(**section)


__all__ = [
    "DeepSpeedZeroConfig",
    "OffloadOptimizerConfig",
    "OffloadParamConfig",
    "ZeroStageEnum",
    "get_zero_config",
]
