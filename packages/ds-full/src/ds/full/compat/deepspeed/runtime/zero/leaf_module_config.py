"""``deepspeed.runtime.zero.leaf_module_config``: ``zero_optimization.leaf_module`` and its
defaults (ds's model of the section; ``ds.zero.stage3.leaf`` acts on it)."""

from __future__ import annotations

from ds.zero.config.sections_aux import DEFAULT_LEAF_MODULE_CLASSES
from ds.zero.config.sections_aux import LeafModuleConfig as DeepSpeedZeroLeafModuleConfig

DEFAULT_LEAF_MODULE_NAMES: list[str] = []
DEFAULT_LEAF_MODULE_NAME_SUFFIXES: list[str] = []

__all__ = [
    "DEFAULT_LEAF_MODULE_CLASSES",
    "DEFAULT_LEAF_MODULE_NAMES",
    "DEFAULT_LEAF_MODULE_NAME_SUFFIXES",
    "DeepSpeedZeroLeafModuleConfig",
]
