"""``deepspeed.profiling.flops_profiler``: not available in ds yet (ds-monitor will carry it)."""

from __future__ import annotations

from ds.full.compat.deepspeed._missing import missing_class, missing_function

_FEATURE = "the flops profiler (deepspeed.profiling.flops_profiler)"
_HINT = "remove the flops_profiler section or profile with torch.profiler"
FlopsProfiler = missing_class("deepspeed.profiling.flops_profiler.FlopsProfiler", _FEATURE, _HINT)
get_model_profile = missing_function(
    "deepspeed.profiling.flops_profiler.get_model_profile", _FEATURE, _HINT
)

__all__ = ["FlopsProfiler", "get_model_profile"]
