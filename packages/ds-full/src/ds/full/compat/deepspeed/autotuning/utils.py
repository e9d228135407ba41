"""``deepspeed.autotuning.utils``: reading and writing a key anywhere in a nested config."""

from __future__ import annotations

from typing import Any


def get_val_by_key(d: dict[str, Any], k: str) -> Any:
    """The value of ``k`` in ``d`` or, depth first, in the first nested dict holding it (None when
    no dict does)."""
    if k in d:
        return d[k]
    for v in d.values():
        if isinstance(v, dict):
            found = get_val_by_key(v, k)
            if found is not None:
                return found
    return None


def set_val_by_key(d: dict[str, Any], k: str, vv: Any) -> None:
    """Set ``k`` to ``vv`` in ``d`` and in every nested dict that has the key."""
    if k in d:
        d[k] = vv
    for v in d.values():
        if isinstance(v, dict):
            set_val_by_key(v, k, vv)


__all__ = ["get_val_by_key", "set_val_by_key"]
