"""``deepspeed.module_inject.auto_ep_presets.registry``: which AutoEP family a transformers
``model_type`` belongs to (:mod:`ds.parallel.moe.autoep_config`)."""

from __future__ import annotations

from ds.full.compat.deepspeed._missing import missing_function
from ds.parallel.moe.autoep_config import (
    PRESET_MODELS,
    preset_name_for_hf_model_type,
    unsupported_preset_for_hf_model_type,
)

get_preset_adapter = missing_function(
    "deepspeed.module_inject.auto_ep_presets.registry.get_preset_adapter",
    "DeepSpeed's AutoEP preset adapters",
    "ds's AutoEP (expert_parallel.autoep_size) handles transformers' fused MoE blocks directly",
)


def available_preset_names() -> tuple[str, ...]:
    return tuple(PRESET_MODELS)


__all__ = [
    "PRESET_MODELS",
    "available_preset_names",
    "get_preset_adapter",
    "preset_name_for_hf_model_type",
    "unsupported_preset_for_hf_model_type",
]
