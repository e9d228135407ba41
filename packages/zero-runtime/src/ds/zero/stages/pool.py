"""Reusable flat buffers for the stage 0-2 collectives.

Stage-2 gradient buckets are filled one after another within one backward, and parameter-gather
staging buffers chunk after chunk within one gather; fresh multi-MB allocations each time cost page
faults (host) or allocator churn (device) comparable to the copies. Buffers are keyed by length
and handed back by dtype and device; the owner clears the pool when a phase ends so the optimizer
step's peak does not carry them.
"""

from __future__ import annotations

from typing import Any

import torch


class BufferPool:
    def __init__(self) -> None:
        self._free: dict[int, list[torch.Tensor]] = {}

    def take(self, numel: int, device: Any, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        free = self._free.get(numel)
        if free:
            for i in range(len(free) - 1, -1, -1):
                t = free[i]
                if t.dtype == dtype and t.device == torch.device(device):
                    return free.pop(i)
        return torch.empty(numel, dtype=dtype, device=device)

    def give(self, t: torch.Tensor) -> None:
        self._free.setdefault(t.numel(), []).append(t)

    def clear(self) -> None:
        self._free.clear()

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for ts in self._free.values() for t in ts)
