"""Shared fixtures: each multi-process scenario runs once per session on a real gloo world."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _launch import run_world

_cache: dict[str, Any] = {}


def scenario(name: str, tmp_path_factory: pytest.TempPathFactory, world: int = 2) -> Any:
    key = f"{name}/{world}"
    if key not in _cache:
        out = tmp_path_factory.mktemp(f"zero-{name}-{world}")
        _cache[key] = run_world(name, world, out)
    return _cache[key]
