"""``deepspeed.ops.lion.DeepSpeedCPULion`` -> ds.ops CPULion (SIMD CPU kernels)."""

from __future__ import annotations

from typing import Any


def __getattr__(name: str) -> Any:
    if name in ("DeepSpeedCPULion", "CPULion"):
        from ds.ops.optim.lion import CPULion

        return CPULion
    raise AttributeError(f"deepspeed.ops.lion.{name} has no ds equivalent")


__all__: list[str] = []  # DeepSpeedCPULion resolves lazily
