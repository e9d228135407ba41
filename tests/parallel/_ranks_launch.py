"""Start a gloo world of ``script`` (argv: rank world port *args) and wait for every rank."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import torch
from world import run_script


def run_ranks(
    script: Path, world: int, args: list[str], timeout: float, env: Mapping[str, str] | None = None
) -> None:
    """Raises with the failing rank's output tail when any rank exits non-zero."""
    run_script(
        script, world, lambda r, port: [str(r), str(world), port, *args], timeout=timeout, env=env
    )


def run_scenarios(
    script: Path,
    world: int,
    out: Path,
    scenarios: list[str],
    timeout: float,
    env: Mapping[str, str] | None = None,
) -> dict[str, dict]:
    """Run ``script RANK WORLD PORT OUT *scenarios`` on one world; return each scenario's
    ``OUT/<scenario>/result.pt`` (rank 0 writes it) with that folder as ``"dir"``."""
    run_ranks(script, world, [str(out), *scenarios], timeout, env)
    results = {}
    for s in scenarios:
        where = out / s.replace(":", "-")
        results[s] = {**torch.load(where / "result.pt", weights_only=False), "dir": where}
    return results
