"""``deepspeed.ops``: the CPU optimizers (``deepspeed.ops.adam.DeepSpeedCPUAdam``)."""

from ds.full.compat.deepspeed.ops import adam

__all__ = ["adam"]
