"""``deepspeed.runtime.zero.offload_config``: the enums of ``engine.offload_states()``."""

from __future__ import annotations

from ds.zero.offload_states import OffloadDeviceEnum, OffloadStateTypeEnum

__all__ = ["OffloadDeviceEnum", "OffloadStateTypeEnum"]
