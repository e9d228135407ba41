"""``deepspeed.checkpointing`` -> ``ds.zero.checkpointing`` (activation checkpointing)."""

from __future__ import annotations

from typing import Any


def __getattr__(name: str) -> Any:
    import ds.zero.checkpointing as ckpt

    return getattr(ckpt, name)
