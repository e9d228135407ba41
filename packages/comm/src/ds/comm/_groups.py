"""Small helpers about process groups used by the logger, watchdog and consistency checks."""

from __future__ import annotations

from typing import Any

import torch.distributed as _dist


def group_size(group: Any) -> int:
    return int(_dist.get_world_size(group)) if _dist.is_initialized() else 1


def global_rank() -> int:
    return int(_dist.get_rank()) if _dist.is_initialized() else 0


def group_ranks(group: Any) -> list[int]:
    """Global ranks of the members of ``group`` (the default group when None)."""
    if group is None or group is _dist.group.WORLD:
        return list(range(_dist.get_world_size()))
    return list(_dist.get_process_group_ranks(group))


def group_key(group: Any) -> str:
    """A name that is identical on every member of the group (used as a store key)."""
    if group is None or group is _dist.group.WORLD:
        return "world"
    name = getattr(group, "group_name", None)
    if name:
        return str(name)
    return "ranks-" + "-".join(str(r) for r in group_ranks(group))


def group_label(group: Any) -> str:
    """Human-readable group description for error messages."""
    if group is None or group is _dist.group.WORLD:
        return f"world (ranks 0..{_dist.get_world_size() - 1})"
    return f"{group_key(group)} (ranks {group_ranks(group)})"
