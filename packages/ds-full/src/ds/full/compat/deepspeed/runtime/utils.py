"""``deepspeed.runtime.utils``: the helpers integrations call."""

from __future__ import annotations

from typing import Any

import torch


def move_to_device(item: Any, device: Any, criterion_func: Any = None) -> Any:
    """Move the tensors inside nested lists, tuples and dicts to ``device`` (others unchanged).

    ``criterion_func(tensor)`` (optional) selects which tensors move, as in DeepSpeed."""
    if isinstance(item, torch.Tensor):
        if criterion_func is None or criterion_func(item):
            return item.to(device)
        return item
    if isinstance(item, list):
        return [move_to_device(v, device, criterion_func) for v in item]
    if isinstance(item, tuple):
        return tuple(move_to_device(v, device, criterion_func) for v in item)
    if isinstance(item, dict):
        return {k: move_to_device(v, device, criterion_func) for k, v in item.items()}
    return item


def set_random_seed(seed: int) -> None:
    """Seed Python's ``random``, NumPy's global generator and torch (every device) with ``seed``
    (reduced modulo what each accepts: 2**32 for NumPy, 2**63 for torch)."""
    import random

    import numpy

    seed = int(seed)
    random.seed(seed)
    numpy.random.seed(seed % (2**32))
    torch.manual_seed(seed % (2**63))


def see_memory_usage(message: str, force: bool = False) -> None:
    """DeepSpeed prints allocator statistics here; ds reports memory through ``ds report`` and
    the engine's ``memory_report()``, so this only logs the message when forced."""
    if force:
        from ds.interfaces.logging import get_logger

        get_logger(__name__).info("memory usage", message=message)


__all__ = ["move_to_device", "see_memory_usage", "set_random_seed"]
