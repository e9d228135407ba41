"""``deepspeed.accelerator.mps_accelerator.MPS_Accelerator``: ds's Apple MPS accelerator."""

from __future__ import annotations

from ds.full.compat.deepspeed.accelerator.abstract_accelerator import DeepSpeedAccelerator
from ds.interfaces import registry


class MPS_Accelerator(DeepSpeedAccelerator):
    def __init__(self) -> None:
        super().__init__(registry.get(registry.ACCELERATORS, "mps")())


__all__ = ["MPS_Accelerator"]
