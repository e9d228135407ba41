"""Did-you-mean hints for misspelt keys."""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Mapping
from typing import Any


def closest(key: str, known: Iterable[str]) -> str:
    """`` (did you mean 'x'?)`` when a known key is close to ``key``, else ``""``."""
    choices = list(known)
    lowered = {c.lower(): c for c in choices}
    if key.lower() in lowered:
        return f" (did you mean {lowered[key.lower()]!r}?)"
    match = difflib.get_close_matches(key, choices, n=1, cutoff=0.6)
    return f" (did you mean {match[0]!r}?)" if match else ""


def unknown_keys_message(given: Mapping[str, Any], known: Iterable[str], where: str) -> str:
    known_set = set(known)
    bad = [k for k in given if k not in known_set]
    if not bad:
        return ""
    parts = [f"{k!r}{closest(k, known_set)}" for k in bad]
    return (
        f"unknown key(s) in {where}: {', '.join(parts)}; known keys: {', '.join(sorted(known_set))}"
    )
