"""Time spent inside collectives, accumulated per optimizer step for telemetry."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any


class CommStats:
    def __init__(self) -> None:
        self.seconds = 0.0
        self.calls = 0

    def time(self, fn: Callable[[], Any]) -> Any:
        t0 = time.perf_counter()
        try:
            return fn()
        finally:
            self.seconds += time.perf_counter() - t0
            self.calls += 1

    def take(self) -> float:
        """Seconds since the last call, and reset."""
        out, self.seconds, self.calls = self.seconds, 0.0, 0
        return out
