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


def partition_uniform(num_items: int, num_parts: int) -> list[int]:
    """Part bounds ``[0, ..., num_items]`` with equal counts (ds's pipeline partitioner)."""
    from ds.parallel.pipeline.partition import uniform

    return uniform(num_items, num_parts)


def partition_balanced(weights: list[int], num_parts: int) -> list[int]:
    """Part bounds minimising the heaviest part (ds's pipeline partitioner); with more parts than
    items, each item gets its own part and the rest are empty, as in DeepSpeed."""
    from ds.parallel.pipeline.partition import balanced

    n = len(weights)
    if num_parts >= n:
        return list(range(n + 1)) + [n] * (num_parts - n)
    # Filled from the right, as DeepSpeed's leaves the lighter parts first.
    mirrored = balanced(list(reversed(weights)), num_parts)
    return [n - b for b in reversed(mirrored)]


def call_to_str(base: str, *args: Any, **kwargs: Any) -> str:
    """``"base(arg, key=value)"`` (DeepSpeed's rendering of a call in logs)."""
    parts = [repr(a) for a in args] + [f"{k}={v!r}" for k, v in kwargs.items()]
    return f"{base}({', '.join(parts)})"


def see_memory_usage(message: str, force: bool = False) -> None:
    """DeepSpeed prints allocator statistics here; ds reports memory through ``ds report`` and
    the engine's ``memory_report()``, so this only logs the message when forced."""
    if force:
        from ds.interfaces.logging import get_logger

        get_logger(__name__).info("memory usage", message=message)


__all__ = [
    "call_to_str",
    "move_to_device",
    "partition_balanced",
    "partition_uniform",
    "see_memory_usage",
    "set_random_seed",
]
