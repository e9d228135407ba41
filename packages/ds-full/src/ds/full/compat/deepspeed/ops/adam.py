"""``deepspeed.ops.adam.DeepSpeedCPUAdam`` -> ``ds.ops`` CPUAdam (SIMD CPU kernels)."""

from __future__ import annotations

from typing import Any


def __getattr__(name: str) -> Any:
    if name in ("DeepSpeedCPUAdam", "CPUAdam"):
        from ds.ops.optim.adam import CPUAdam

        return CPUAdam
    raise AttributeError(f"deepspeed.ops.adam.{name} has no ds equivalent")
