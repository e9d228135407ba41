"""``deepspeed.moe.layer.MoE``: not available in ds."""

from ds.full.compat.deepspeed._missing import missing_class

MoE = missing_class(
    "deepspeed.moe.layer.MoE",
    "mixture-of-experts layers (expert parallelism)",
    "train the dense model, or use DeepSpeed for MoE models",
)

__all__ = ["MoE"]
