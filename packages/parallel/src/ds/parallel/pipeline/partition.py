"""Cutting a list of layers into contiguous pipeline parts (DeepSpeed's partition methods).

Pure functions of the layer list: every rank computes the same bounds without communication.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from ds.interfaces.errors import ConfigError


def uniform(num_items: int, num_parts: int) -> list[int]:
    """Bounds ``[b0=0, b1, ..., bn=num_items]`` giving each part the same count (the first parts
    one more when it does not divide)."""
    base, extra = divmod(num_items, num_parts)
    bounds = [0]
    for p in range(num_parts):
        bounds.append(bounds[-1] + base + (1 if p < extra else 0))
    return bounds


def balanced(weights: Sequence[int], num_parts: int) -> list[int]:
    """Bounds minimising the heaviest part's total weight, every part holding at least one item
    (binary search on the bottleneck, greedy fill; exact for non-negative integer weights)."""
    n = len(weights)
    prefix = [0]
    for w in weights:
        prefix.append(prefix[-1] + int(w))

    def cut(limit: int) -> list[int] | None:
        # Greedy from the left, leaving at least one item for every later part.
        bounds, start = [0], 0
        for part in range(num_parts):
            left = num_parts - part - 1
            end = start + 1
            if prefix[end] - prefix[start] > limit:
                return None
            while end < n - left and prefix[end + 1] - prefix[start] <= limit:
                end += 1
            if part == num_parts - 1:
                end = n
                if prefix[end] - prefix[start] > limit:
                    return None
            bounds.append(end)
            start = end
        return bounds

    lo, hi = max(int(w) for w in weights) if weights else 0, prefix[-1]
    while lo < hi:
        mid = (lo + hi) // 2
        if cut(mid) is None:
            lo = mid + 1
        else:
            hi = mid
    found = cut(lo)
    assert found is not None
    return found


def partition(
    method: str,
    num_parts: int,
    names: Sequence[str],
    param_counts: Sequence[int],
) -> list[int]:
    """Bounds for ``method``: "uniform" (equal layer counts), "parameters" (balanced trainable
    parameter counts) or "type:REGEX" (balanced counts of layers whose class name matches)."""
    n = len(names)
    if num_parts > n:
        raise ConfigError(
            f"num_stages={num_parts} exceeds the number of layers {n}; use at most {n} stages "
            "or split the model into more layers"
        )
    kind = method.lower()
    if kind == "uniform":
        return uniform(n, num_parts)
    if kind == "parameters":
        return balanced(param_counts, num_parts)
    if kind.startswith("type:"):
        pattern = re.compile(method[5:], re.IGNORECASE)
        marks = [1 if pattern.search(name) else 0 for name in names]
        if not any(marks):
            raise ConfigError(
                f"partition_method={method!r} matches none of the layer types "
                f"{sorted(set(names))}; use a regex matching one of them"
            )
        return balanced(marks, num_parts)
    raise ConfigError(
        f"partition_method={method!r} is not known; use 'parameters', 'uniform' or 'type:REGEX'"
    )


__all__ = ["balanced", "partition", "uniform"]
