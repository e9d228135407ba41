"""``deepspeed.runtime``: the submodules scripts and integrations import from it."""

from __future__ import annotations

from typing import Any

from ds.full.compat.deepspeed.runtime import lr_schedules, utils


def __getattr__(name: str) -> Any:
    if name == "DeepSpeedEngine":
        from ds.zero.engine import ZeroEngine

        return ZeroEngine
    import importlib.util

    if not name.startswith("_") and importlib.util.find_spec(f"{__name__}.{name}") is not None:
        return importlib.import_module(f"{__name__}.{name}")  # a submodule, on first use
    raise AttributeError(f"deepspeed.runtime.{name} has no ds equivalent")


__all__ = ["lr_schedules", "utils"]
