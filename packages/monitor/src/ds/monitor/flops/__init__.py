"""The flops profiler (``flops_profiler`` config block) and ``get_model_profile``."""

from __future__ import annotations

from ds.monitor.flops.model_profile import get_model_profile
from ds.monitor.flops.profiler import FlopsProfiler, ModuleStats, number_to_string
from ds.monitor.flops.report import format_profile

__all__ = [
    "FlopsProfiler",
    "ModuleStats",
    "format_profile",
    "get_model_profile",
    "number_to_string",
]
