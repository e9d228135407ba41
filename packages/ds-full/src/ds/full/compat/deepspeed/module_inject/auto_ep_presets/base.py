"""``deepspeed.module_inject.auto_ep_presets.base``: AutoEP's config and layer description
(:mod:`ds.parallel.moe.autoep_config`)."""

from __future__ import annotations

from ds.parallel.moe.autoep_config import UNSET as _UNSET
from ds.parallel.moe.autoep_config import AutoEPConfig, MoELayerSpec

__all__ = ["_UNSET", "AutoEPConfig", "MoELayerSpec"]
