"""``deepspeed.utils.pin_memory_tracker``: a process-wide running total of pinned host memory.

Pinned pages cannot be swapped and count against the memlock limit, so when a host runs out of
memory far from where it was pinned, the total (and when it crossed 32, 64, 128 GB, ...) says
where the budget went. It logs on DeepSpeed's logger name, ``DeepSpeed``, which scripts configure
to see these lines.
"""

from __future__ import annotations

import logging

logger = logging.getLogger("DeepSpeed")

_GB = 1024**3
# Milestones double from here, so a large offload logs a handful of lines, not one per buffer.
_CHECKPOINT_BASE_GB = 32


def _fmt_bytes(num_bytes: int) -> str:
    for unit, size, digits in (("GB", 1024**3, 3), ("MB", 1024**2, 2), ("KB", 1024, 1)):
        if num_bytes >= size:
            return f"{num_bytes / size:.{digits}f} {unit}"
    return f"{num_bytes} B"


class _PinnedMemoryTracker:
    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self._bytes = 0
        self._calls = 0
        self._next_checkpoint = _CHECKPOINT_BASE_GB * _GB

    def track(self, num_bytes: int) -> None:
        self._bytes += int(num_bytes)
        self._calls += 1
        logger.debug(
            "pin_memory: +%s (call #%d, running total: %s)",
            _fmt_bytes(num_bytes), self._calls, _fmt_bytes(self._bytes),
        )  # fmt: skip
        while self._bytes >= self._next_checkpoint:
            logger.info(
                f"[pinned-memory checkpoint] crossed {_fmt_bytes(self._next_checkpoint)}: "
                f"{_fmt_bytes(self._bytes)} pinned across {self._calls} allocations"
            )
            self._next_checkpoint *= 2

    def log_summary(self, tag: str = "") -> None:
        prefix = f"[pinned-memory {tag}] " if tag else "[pinned-memory] "
        logger.info(f"{prefix}{_fmt_bytes(self._bytes)} pinned across {self._calls} allocations")


_tracker = _PinnedMemoryTracker()


def track_pinned_memory(num_bytes: int) -> None:
    _tracker.track(num_bytes)


def pinned_memory_summary(tag: str = "") -> None:
    _tracker.log_summary(tag)


__all__ = ["pinned_memory_summary", "track_pinned_memory"]
