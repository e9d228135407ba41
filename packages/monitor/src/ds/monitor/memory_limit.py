"""The host memory a process may use: its cgroup's memory limit when one is set (cgroup v2
``memory.max``, v1 ``memory.limit_in_bytes``, the tightest on the way up from the process's own
cgroup), else the machine's memory. A container's limit is what the OOM killer enforces, so it,
not the machine's RAM, is what the readiness gate's memory term (ZOMM) divides by.

``$DS_MEMORY_LIMIT_FILE`` names a file read the same way as ``memory.max`` (a byte count, or
``max`` for none) instead of the cgroup's: for a test, or a scheduler that enforces its own limit.
"""

from __future__ import annotations

import os
from pathlib import Path

from ds.interfaces.errors import ConfigError

ENV = "DS_MEMORY_LIMIT_FILE"
CGROUP_ROOT = Path("/sys/fs/cgroup")
# cgroup v1 writes "no limit" as PAGE_COUNTER_MAX pages: a number near 2**63.
_UNLIMITED = 1 << 60


def read_limit(path: str | Path) -> int | None:
    """Bytes from a ``memory.max``-style file; None for ``max`` (no limit)."""
    text = Path(path).read_text(encoding="ascii").strip()
    if text == "max":
        return None
    try:
        value = int(text)
    except ValueError as exc:
        raise ConfigError(
            f"{path} holds {text[:40]!r}, not a memory limit; write a byte count or 'max'"
        ) from exc
    return value if 0 < value < _UNLIMITED else None


def _cgroup_files(proc_cgroup: str = "/proc/self/cgroup") -> list[Path]:
    """The limit files of this process's cgroup and its ancestors, own first."""
    try:
        lines = Path(proc_cgroup).read_text(encoding="utf-8").splitlines()
    except OSError:
        return []
    files: list[Path] = []
    for line in lines:
        _, controllers, rel = line.split(":", 2)
        if controllers == "":  # v2 unified hierarchy
            base, name = CGROUP_ROOT, "memory.max"
        elif "memory" in controllers.split(","):
            base, name = CGROUP_ROOT / "memory", "memory.limit_in_bytes"
        else:
            continue
        here = Path(rel.strip() or "/")
        for part in (here, *here.parents):
            files.append(base / str(part).lstrip("/") / name)
    return files


def cgroup_limit() -> int | None:
    """The tightest memory limit over this process's cgroups (or ``$DS_MEMORY_LIMIT_FILE``)."""
    override = os.environ.get(ENV)
    if override:
        if not os.path.isfile(override):
            raise ConfigError(
                f"{ENV}={override} is not a file; point it at a memory.max-style file or unset it"
            )
        return read_limit(override)
    limits = []
    for f in _cgroup_files():
        try:
            limit = read_limit(f)
        except (OSError, ConfigError):
            continue
        if limit is not None:
            limits.append(limit)
    return min(limits) if limits else None


def host_memory_limit(machine_bytes: int) -> int:
    """The memory this process may use: the cgroup limit when set and tighter, else the RAM."""
    limit = cgroup_limit()
    if limit is None:
        return machine_bytes
    return min(limit, machine_bytes) if machine_bytes > 0 else limit
