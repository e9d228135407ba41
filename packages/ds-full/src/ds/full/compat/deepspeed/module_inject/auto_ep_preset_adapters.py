"""``deepspeed.module_inject.auto_ep_preset_adapters``: see
:mod:`ds.full.compat.deepspeed.module_inject.auto_ep_presets.registry`."""

from __future__ import annotations

from ds.full.compat.deepspeed.module_inject.auto_ep_presets.registry import get_preset_adapter

__all__ = ["get_preset_adapter"]
