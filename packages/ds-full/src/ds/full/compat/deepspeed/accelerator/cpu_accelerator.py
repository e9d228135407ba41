"""``deepspeed.accelerator.cpu_accelerator.CPU_Accelerator``: ds's CPU accelerator."""

from __future__ import annotations

from ds.full.compat.deepspeed.accelerator.abstract_accelerator import DeepSpeedAccelerator
from ds.interfaces import registry


class CPU_Accelerator(DeepSpeedAccelerator):
    def __init__(self) -> None:
        super().__init__(registry.get(registry.ACCELERATORS, "cpu")())


__all__ = ["CPU_Accelerator"]
