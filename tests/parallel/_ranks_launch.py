"""Start a gloo world of ``script`` (argv: rank world port *args) and wait for every rank."""

from __future__ import annotations

from pathlib import Path

from world import run_script


def run_ranks(script: Path, world: int, args: list[str], timeout: float) -> None:
    """Raises with the failing rank's output tail when any rank exits non-zero."""
    run_script(script, world, lambda r, port: [str(r), str(world), port, *args], timeout=timeout)
