"""``deepspeed.runtime``: the submodules scripts and integrations import from it."""

from __future__ import annotations

from typing import Any

from ds.full.compat.deepspeed.runtime import lr_schedules, utils


def __getattr__(name: str) -> Any:
    if name == "DeepSpeedEngine":
        from ds.zero.engine import ZeroEngine

        return ZeroEngine
    if name in ("engine", "zero", "pipe", "sequence_parallel"):
        import importlib

        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"deepspeed.runtime.{name} has no ds equivalent")


__all__ = ["lr_schedules", "utils"]
