"""``deepspeed.pipe``: pipeline parallelism, which ds does not have yet."""

from __future__ import annotations

from ds.full.compat.deepspeed._missing import missing_class

_FEATURE = "pipeline parallelism (deepspeed.pipe)"
_HINT = "ds trains data-parallel with ZeRO 0-3; use a plain nn.Module with ZeRO-3 instead"
PipelineModule = missing_class("deepspeed.pipe.PipelineModule", _FEATURE, _HINT)
LayerSpec = missing_class("deepspeed.pipe.LayerSpec", _FEATURE, _HINT)
TiedLayerSpec = missing_class("deepspeed.pipe.TiedLayerSpec", _FEATURE, _HINT)

__all__ = ["LayerSpec", "PipelineModule", "TiedLayerSpec"]
