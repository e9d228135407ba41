"""``deepspeed.accelerator``: ``get_accelerator()`` / ``set_accelerator()`` and the accelerator
classes (``real_accelerator``, ``abstract_accelerator``, ``cpu_accelerator``,
``cuda_accelerator``), served by ds's accelerators."""

from ds.full.compat.deepspeed.accelerator.abstract_accelerator import DeepSpeedAccelerator
from ds.full.compat.deepspeed.accelerator.real_accelerator import (
    get_accelerator,
    is_current_accelerator_supported,
    set_accelerator,
)

__all__ = [
    "DeepSpeedAccelerator",
    "get_accelerator",
    "is_current_accelerator_supported",
    "set_accelerator",
]
