"""``deepspeed.runtime.engine.DeepSpeedEngine`` -> ``ds.zero.engine.ZeroEngine``."""

from __future__ import annotations

from ds.zero.engine import ZeroEngine as DeepSpeedEngine

__all__ = ["DeepSpeedEngine"]
