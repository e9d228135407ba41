"""``deepspeed.accelerator.get_accelerator`` -> the accelerator ds.full would pick."""

from __future__ import annotations

import functools
from typing import Any

from ds.interfaces import registry


@functools.cache
def get_accelerator() -> Any:
    from ds.full.training import _accelerator_name

    return registry.get(registry.ACCELERATORS, _accelerator_name())()


__all__ = ["get_accelerator"]
