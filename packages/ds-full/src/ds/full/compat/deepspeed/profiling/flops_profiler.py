"""``deepspeed.profiling.flops_profiler``: ds's flops profiler (:mod:`ds.monitor.flops`).

``FlopsProfiler(model, ds_engine=None, recompute_fwd_factor=0.0)`` with ``start_profile`` /
``stop_profile`` / ``get_total_flops`` / ``get_total_macs`` / ``get_total_params`` /
``end_profile``, and ``get_model_profile(model, input_shape=..., args=..., kwargs=...)`` returning
``(flops, macs, params)``, as in DeepSpeed."""

from __future__ import annotations

from typing import Any

import torch

from ds.monitor.flops import FlopsProfiler as _FlopsProfiler
from ds.monitor.flops import get_model_profile, number_to_string


class FlopsProfiler(_FlopsProfiler):
    """ds's profiler under DeepSpeed's constructor (``ds_engine`` second, kept for callers)."""

    def __init__(
        self, model: torch.nn.Module, ds_engine: Any = None, recompute_fwd_factor: float = 0.0
    ) -> None:
        super().__init__(model, recompute_fwd_factor=recompute_fwd_factor)
        self.ds_engine = ds_engine


__all__ = ["FlopsProfiler", "get_model_profile", "number_to_string"]
