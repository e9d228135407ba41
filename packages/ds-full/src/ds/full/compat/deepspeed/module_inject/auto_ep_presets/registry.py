"""``deepspeed.module_inject.auto_ep_presets.registry``: AutoEP's MoE families, which transformers
``model_type`` each covers and their compatibility checks (:mod:`ds.parallel.moe.autoep_config`)."""

from __future__ import annotations

from ds.parallel.moe.autoep_config import (
    PRESET_MODELS,
    preset_name_for_hf_model_type,
    unsupported_preset_for_hf_model_type,
)
from ds.parallel.moe.autoep_config import family_adapter as get_preset_adapter


def available_preset_names() -> tuple[str, ...]:
    return tuple(PRESET_MODELS)


__all__ = [
    "PRESET_MODELS",
    "available_preset_names",
    "get_preset_adapter",
    "preset_name_for_hf_model_type",
    "unsupported_preset_for_hf_model_type",
]
