"""``deepspeed.ops``: the CPU optimizers and FusedAdam (``deepspeed.ops.adam.DeepSpeedCPUAdam``)."""

from ds.full.compat.deepspeed.ops import adagrad, adam, lion

__all__ = ["adagrad", "adam", "lion"]
