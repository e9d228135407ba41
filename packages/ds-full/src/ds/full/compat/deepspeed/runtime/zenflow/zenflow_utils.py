"""``deepspeed.runtime.zenflow.zenflow_utils``: how a rank's cores split between the training
process and ZenFlow's optimizer process."""

from __future__ import annotations

import math


def _split_affinity(cores: list[int], pt_reserved_cores_perc: float) -> tuple[list[int], list[int]]:
    """``(optimizer cores, training cores)``: training keeps the first
    ``ceil(pt_reserved_cores_perc * len(cores))``, the optimizer the rest. When that share is
    none or all of them, isolating one side would leave the other without a core, so both get
    the whole set."""
    reserved = math.ceil(pt_reserved_cores_perc * len(cores))
    if 0 < reserved < len(cores):
        return list(cores[reserved:]), list(cores[:reserved])
    return list(cores), list(cores)


__all__ = ["_split_affinity"]
