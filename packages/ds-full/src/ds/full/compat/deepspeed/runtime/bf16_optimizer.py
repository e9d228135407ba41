"""``deepspeed.runtime.bf16_optimizer.BF16_Optimizer``: DeepSpeed's wrapper that keeps fp32
masters for bf16 parameters outside ZeRO. ds's engines keep the fp32 masters of a bf16 run
themselves (``bf16.enabled`` in the config), so the class imports and refuses construction."""

from __future__ import annotations

from ds.full.compat.deepspeed._missing import missing_class

BF16_Optimizer = missing_class(
    "deepspeed.runtime.bf16_optimizer.BF16_Optimizer",
    "DeepSpeed's stand-alone bf16 optimizer wrapper",
    "set bf16.enabled in the config: the engine deepspeed.initialize returns keeps the fp32 "
    "master weights of bf16 parameters itself",
)

__all__ = ["BF16_Optimizer"]
