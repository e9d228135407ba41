"""Breakdown of a training step (forward, backward, optimizer) without host syncs.

On a device that runs kernels asynchronously and has events (``capabilities().has_events``),
with ``device_times`` on (the engine's ``wall_clock_breakdown``), each phase is a pair of timing
events recorded on the current stream, and durations are read one window late: ``take()`` at
the end of step N returns step N-1's device times, whose events lie behind step N's
synchronisation point, so reading them waits for nothing (CUDA's elapsed_time of two complete
events). Otherwise the phases are timed by the host's wall clock, which on an asynchronous device
is the time to launch the work (nothing waits for the device); on CPU, kernels finish before
they return and the wall clock is the device's time.
"""

from __future__ import annotations

import time
from collections import defaultdict
from typing import Any


class StepTimers:
    def __init__(self, accelerator: Any = None, device_times: bool = True) -> None:
        caps = accelerator.capabilities() if accelerator is not None else None
        use_events = (
            device_times
            and caps is not None
            and caps.has_events
            and not caps.is_synchronized_device
        )
        self.accelerator = accelerator if use_events else None
        self.totals: dict[str, float] = defaultdict(float)
        self._start: dict[str, Any] = {}
        self._window: list[tuple[str, Any, Any]] = []  # (name, start, end) events this window
        self._pending: list[tuple[str, Any, Any]] = []  # the previous window's

    @property
    def uses_events(self) -> bool:
        return self.accelerator is not None

    def _mark(self) -> Any:
        if self.accelerator is None:
            return time.perf_counter()
        event = self.accelerator.new_event(enable_timing=True)
        event.record()
        return event

    def start(self, name: str) -> None:
        self._start[name] = self._mark()

    def stop(self, name: str) -> float:
        """End ``name``'s interval; returns its wall-clock seconds (0.0 with device events,
        whose duration is known only at a later ``take``)."""
        began = self._start.pop(name, None)
        if began is None:
            return 0.0
        end = self._mark()
        if self.accelerator is not None:
            self._window.append((name, began, end))
            return 0.0
        elapsed = float(end - began)
        self.totals[name] += elapsed
        return elapsed

    def take(self) -> dict[str, float]:
        """Totals since the last call (seconds; with device events, the previous window's),
        then reset."""
        if self.accelerator is not None:
            pending, self._pending, self._window = self._pending, self._window, []
            for name, began, end in pending:
                # Behind the last synchronisation point: complete, so reading waits for nothing.
                self.totals[name] += began.elapsed_time(end) / 1e3  # milliseconds
        out = dict(self.totals)
        self.totals.clear()
        return out
