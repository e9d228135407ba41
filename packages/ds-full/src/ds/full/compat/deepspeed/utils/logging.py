"""``deepspeed.utils.logging``: DeepSpeed's one library logger, rank-aware logging and the level
names the config's ``log_level`` takes.

The logger sits under ds's ``ds`` logger tree, so an application's handlers for ds see it too.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

log_levels = {
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warning": logging.WARNING,
    "error": logging.ERROR,
    "critical": logging.CRITICAL,
}

# DeepSpeed's module-level logger is a plain ``logging.Logger`` that scripts call .info/.warning on.
logger = logging.getLogger("ds.deepspeed_compat")


def log_dist(message: str, ranks: Iterable[int] | None = None, level: int = logging.INFO) -> None:
    """Log ``message`` on the listed ranks (all ranks when ``ranks`` contains -1; rank 0 when
    ``ranks`` is None, as DeepSpeed does)."""
    from ds import comm

    rank = comm.get_rank() if comm.is_initialized() else 0
    wanted = set(ranks) if ranks is not None else {0}
    if -1 in wanted or rank in wanted:
        logger.log(level, f"[Rank {rank}] {message}")


def get_log_level_from_string(log_level_str: str) -> int:
    """``"info"`` (any case) -> ``logging.INFO``; an unknown name raises ValueError."""
    level = log_levels.get(str(log_level_str).lower())
    if level is None:
        raise ValueError(
            f"log level {log_level_str!r} is not one of the valid logging levels "
            f"{sorted(log_levels)}"
        )
    return level


def set_log_level_from_string(
    log_level_str: str, custom_logger: logging.Logger | None = None
) -> None:
    """Set the level of ``custom_logger`` (DeepSpeed's logger by default) and of its handlers."""
    level = get_log_level_from_string(log_level_str)
    target = logger if custom_logger is None else custom_logger
    target.setLevel(level)
    for handler in target.handlers:
        handler.setLevel(level)


def get_current_level() -> int:
    return logger.getEffectiveLevel()


def should_log_le(max_log_level_str: str) -> bool:
    """Whether the logger's level is at most ``max_log_level_str`` (its messages would show)."""
    return get_current_level() <= get_log_level_from_string(max_log_level_str)


__all__ = [
    "get_current_level",
    "get_log_level_from_string",
    "log_dist",
    "log_levels",
    "logger",
    "set_log_level_from_string",
    "should_log_le",
]
