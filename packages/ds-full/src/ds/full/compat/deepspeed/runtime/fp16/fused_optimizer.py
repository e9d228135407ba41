"""``deepspeed.runtime.fp16.fused_optimizer.FP16_Optimizer`` (not in ds: see the package)."""

from __future__ import annotations

from ds.full.compat.deepspeed._missing import missing_class

FP16_Optimizer = missing_class(
    "deepspeed.runtime.fp16.fused_optimizer.FP16_Optimizer",
    "DeepSpeed's fp16 wrapper around a fused optimizer",
    "set fp16.enabled in the config: ds's engine keeps fp32 masters and scales the loss itself",
)

__all__ = ["FP16_Optimizer"]
