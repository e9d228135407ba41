"""``deepspeed.accelerator.cuda_accelerator.CUDA_Accelerator``: ds's CUDA accelerator."""

from __future__ import annotations

from ds.full.compat.deepspeed.accelerator.abstract_accelerator import DeepSpeedAccelerator
from ds.interfaces import registry


class CUDA_Accelerator(DeepSpeedAccelerator):
    def __init__(self) -> None:
        super().__init__(registry.get(registry.ACCELERATORS, "cuda")())


__all__ = ["CUDA_Accelerator"]
