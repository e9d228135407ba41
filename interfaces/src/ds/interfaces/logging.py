"""Library logging: structlog loggers backed by stdlib logging with a NullHandler.

Libraries call :func:`get_logger`; only command-line programs call :func:`configure_cli_logging`
(which the launcher's CLI does), so importing ds never changes a user's logging setup.
"""

from __future__ import annotations

import logging
import os
import sys
from typing import Any

logging.getLogger("ds").addHandler(logging.NullHandler())


class _LazyLogger:
    """Resolves the structlog logger on first use: structlog (and rich, which it pulls in)
    costs tens of milliseconds to import, and most modules log only on rare paths."""

    __slots__ = ("_logger", "_name")

    def __init__(self, name: str) -> None:
        self._name = name
        self._logger: Any = None

    def __getattr__(self, attr: str) -> Any:
        if self._logger is None:
            import structlog

            if structlog.is_configured():
                self._logger = structlog.stdlib.get_logger(self._name)
            else:
                # Unconfigured structlog prints to stdout; a library must stay silent unless the
                # application configured logging, so route through the stdlib logger instead.
                self._logger = structlog.wrap_logger(
                    logging.getLogger(self._name),
                    processors=[
                        structlog.stdlib.filter_by_level,
                        structlog.stdlib.add_log_level,
                        structlog.processors.KeyValueRenderer(key_order=["event"]),
                    ],
                    wrapper_class=structlog.stdlib.BoundLogger,
                )
        return getattr(self._logger, attr)


def get_logger(name: str) -> Any:
    """A structlog logger that routes through stdlib ``logging`` under ``name``."""
    return _LazyLogger(name)


def _rank() -> int:
    for key in ("RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "SLURM_PROCID"):
        value = os.environ.get(key)
        if value is not None and value.isdigit():
            return int(value)
    return 0


def configure_cli_logging(level: int = logging.INFO, all_ranks: bool = False) -> None:
    """Configure output for a CLI: pretty on a TTY, JSON lines otherwise; rank 0 only by default."""
    import structlog

    rank = _rank()
    world = os.environ.get("WORLD_SIZE", "1")
    renderer: Any
    if sys.stderr.isatty():
        renderer = structlog.dev.ConsoleRenderer()
    else:
        renderer = structlog.processors.JSONRenderer()
    structlog.configure(
        processors=[
            structlog.stdlib.filter_by_level,
            structlog.contextvars.merge_contextvars,
            structlog.stdlib.add_log_level,
            structlog.stdlib.add_logger_name,
            structlog.processors.TimeStamper(fmt="iso"),
            structlog.processors.format_exc_info,
            renderer,
        ],
        logger_factory=structlog.stdlib.LoggerFactory(),
        wrapper_class=structlog.stdlib.BoundLogger,
        cache_logger_on_first_use=True,
    )
    structlog.contextvars.bind_contextvars(
        rank=rank, world_size=int(world) if world.isdigit() else 1
    )
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(message)s"))
    root = logging.getLogger("ds")
    root.handlers = [h for h in root.handlers if not isinstance(h, logging.StreamHandler)]
    root.addHandler(handler)
    root.setLevel(level if (rank == 0 or all_ranks) else logging.WARNING)
    root.propagate = False
