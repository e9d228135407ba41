"""``deepspeed.runtime.precision_config``: the ``fp16`` and ``bf16`` sections (ds's models)."""

from __future__ import annotations

from typing import Any

from ds.zero.config.sections import BF16Config as DeepSpeedBF16Config
from ds.zero.config.sections import FP16Config as DeepSpeedFP16Config


def get_float16_config(param_dict: dict[str, Any]) -> DeepSpeedFP16Config:
    return DeepSpeedFP16Config(**(param_dict.get("fp16") or {}))


def get_bfloat16_config(param_dict: dict[str, Any]) -> DeepSpeedBF16Config:
    section = param_dict.get("bf16", param_dict.get("bfloat16")) or {}
    return DeepSpeedBF16Config(**section)


__all__ = [
    "DeepSpeedBF16Config",
    "DeepSpeedFP16Config",
    "get_bfloat16_config",
    "get_float16_config",
]
