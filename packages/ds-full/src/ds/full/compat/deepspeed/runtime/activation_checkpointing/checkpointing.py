"""``deepspeed.runtime.activation_checkpointing.checkpointing`` -> ``ds.zero.checkpointing``
(``checkpoint``, ``configure``, ``is_configured``, ``reset``, ...), the module
``deepspeed.checkpointing`` also names."""

from __future__ import annotations

from typing import Any


def __getattr__(name: str) -> Any:
    import ds.zero.checkpointing as ckpt

    try:
        return getattr(ckpt, name)
    except AttributeError:
        raise AttributeError(
            f"deepspeed.runtime.activation_checkpointing.checkpointing.{name} has no ds equivalent"
        ) from None
