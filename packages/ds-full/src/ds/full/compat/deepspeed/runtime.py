"""``deepspeed.runtime``: the few names scripts import from it."""

from __future__ import annotations

from typing import Any


def __getattr__(name: str) -> Any:
    if name == "lr_schedules":
        import ds.zero.lr_schedules as lr_schedules

        return lr_schedules
    if name == "DeepSpeedEngine":
        from ds.zero.engine import ZeroEngine

        return ZeroEngine
    raise AttributeError(f"deepspeed.runtime.{name} has no ds equivalent")
