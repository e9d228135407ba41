"""``deepspeed.utils.timer``: the trimmed mean the comms summary averages with."""

from __future__ import annotations

import statistics
from collections.abc import Sequence


def trim_mean(data: Sequence[float], trim_percent: float) -> float:
    """The mean of ``data`` without its ``trim_percent`` lowest and highest values (0 for no
    data). ``data`` itself is left as it is."""
    if not 0.0 <= trim_percent <= 1.0:
        raise ValueError(f"trim_percent must be within [0, 1], got {trim_percent}")
    if not data:
        return 0
    ordered = sorted(data)
    k = min(round(len(ordered) * trim_percent), (len(ordered) - 1) // 2)  # keep one at least
    return statistics.mean(ordered[k : len(ordered) - k])


__all__ = ["trim_mean"]
