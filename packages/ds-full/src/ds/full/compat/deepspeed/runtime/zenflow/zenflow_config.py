"""``deepspeed.runtime.zenflow.zenflow_config.ZenFlowConfig``: ds's ``zero_optimization.zenflow``
section model (DeepSpeed's fields, defaults and bounds)."""

from __future__ import annotations

from ds.zero.config.sections_aux import ZenFlowConfig

__all__ = ["ZenFlowConfig"]
