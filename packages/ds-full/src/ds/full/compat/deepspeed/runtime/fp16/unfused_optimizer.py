"""``deepspeed.runtime.fp16.unfused_optimizer.FP16_UnfusedOptimizer`` (not in ds: see the
package)."""

from __future__ import annotations

from ds.full.compat.deepspeed._missing import missing_class

FP16_UnfusedOptimizer = missing_class(
    "deepspeed.runtime.fp16.unfused_optimizer.FP16_UnfusedOptimizer",
    "DeepSpeed's fp16 wrapper around an unfused (per-parameter) optimizer",
    "set fp16.enabled in the config: ds's engine keeps fp32 masters and scales the loss itself",
)

__all__ = ["FP16_UnfusedOptimizer"]
