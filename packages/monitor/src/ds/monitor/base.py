"""What every monitor shares: its config block, where it writes, and the errors a user sees."""

from __future__ import annotations

import importlib
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

from ds.interfaces.errors import ConfigError

# (name, value, x) as DeepSpeed's monitors take them; x is the global sample count.
MonitorEvent = tuple[str, float, int]


def require(module: str, monitor: str, extra: str) -> ModuleType:
    """Import an optional client library, or one line naming the extra that installs it."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise ConfigError(
            f"the {monitor} monitor needs the '{module}' package, which is not installed "
            f"({exc.msg}); install it with: pip install 'ds-monitor[{extra}]'"
        ) from None


def writable_dir(path: Path, key: str) -> Path:
    """Create ``path`` and prove it can be written, or one line naming the config key."""
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe = path / f".ds-monitor-probe-{os.getpid()}"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as exc:
        raise ConfigError(
            f"{key}: cannot write monitor output to '{path}' ({exc.strerror or exc}); "
            "set it to a writable directory"
        ) from None
    return path


def output_dir(section: Mapping[str, Any], block: str, rank: int, per_rank: bool) -> Path:
    """DeepSpeed's layout: ``<output_path>/<job_name>`` (the working directory when unset);
    with every rank writing, each rank gets its own ``rank<r>`` below it."""
    base = Path(section.get("output_path") or ".") / str(
        section.get("job_name") or "DeepSpeedJobName"
    )
    if per_rank:
        base = base / f"rank{rank}"
    return writable_dir(base, f"{block}.output_path")


class Monitor:
    """A sink for step events. Subclasses open their client in ``__init__`` and write in
    :meth:`write_events`; :meth:`close` flushes and releases it."""

    block: str = ""

    def __init__(
        self, section: Mapping[str, Any], *, rank: int = 0, per_rank: bool = False
    ) -> None:
        self.section = dict(section)
        self.rank = rank
        self.per_rank = per_rank

    def write_events(self, events: Sequence[MonitorEvent]) -> None:
        raise NotImplementedError

    def flush(self) -> None:
        """Make what was written visible to readers (default: nothing buffered)."""

    def close(self) -> None:
        self.flush()
