"""``deepspeed.module_inject.auto_ep_config``: the ``expert_parallel`` section
(:mod:`ds.parallel.moe.autoep_config`)."""

from ds.parallel.moe.autoep_config import (
    PRESET_MODELS,
    UNSET,
    AutoEPConfig,
    MoELayerSpec,
    fill_autoep_config_from_hf,
    parse_autoep_config,
    validate_autoep_config,
    validate_autoep_post_detection,
)

_UNSET = UNSET

__all__ = [
    "PRESET_MODELS",
    "_UNSET",
    "AutoEPConfig",
    "MoELayerSpec",
    "fill_autoep_config_from_hf",
    "parse_autoep_config",
    "validate_autoep_config",
    "validate_autoep_post_detection",
]
