"""``deepspeed.zero`` -> ``ds.zero`` (Init with DeepSpeed's arguments, GatheredParameters,
register_external_parameter)."""

from __future__ import annotations

from typing import Any


def __getattr__(name: str) -> Any:
    import ds.zero

    if name == "Init":
        from ds.full.compat.deepspeed.runtime.zero.zero_init import Init

        return Init
    if name in ("Init", "GatheredParameters", "register_external_parameter"):
        return getattr(ds.zero, name)
    raise AttributeError(f"deepspeed.zero.{name} has no ds equivalent")
