"""Wall-clock breakdown of a training step (forward, backward, optimizer)."""

from __future__ import annotations

import time
from collections import defaultdict


class StepTimers:
    def __init__(self) -> None:
        self.totals: dict[str, float] = defaultdict(float)
        self._start: dict[str, float] = {}

    def start(self, name: str) -> None:
        self._start[name] = time.perf_counter()

    def stop(self, name: str) -> float:
        began = self._start.pop(name, None)
        if began is None:
            return 0.0
        elapsed = time.perf_counter() - began
        self.totals[name] += elapsed
        return elapsed

    def take(self) -> dict[str, float]:
        """Totals since the last call (seconds), then reset."""
        out = dict(self.totals)
        self.totals.clear()
        return out
