"""``deepspeed.ops.adagrad.DeepSpeedCPUAdagrad`` -> ds.ops CPUAdagrad (SIMD CPU kernels)."""

from __future__ import annotations

from typing import Any


def __getattr__(name: str) -> Any:
    if name in ("DeepSpeedCPUAdagrad", "CPUAdagrad"):
        from ds.ops.optim.adagrad import CPUAdagrad

        return CPUAdagrad
    raise AttributeError(f"deepspeed.ops.adagrad.{name} has no ds equivalent")


__all__: list[str] = []  # DeepSpeedCPUAdagrad resolves lazily
