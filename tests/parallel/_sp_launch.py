"""Start the ranks of a sequence-parallel worker script as subprocesses, bounded in time."""

from __future__ import annotations

from pathlib import Path

from world import run_script


def run_ranks(script: Path, world: int, head: list[str], tail: list[str], timeout: float) -> None:
    """Run ``script *head RANK WORLD PORT *tail`` for each rank; raise with the log of a failed
    rank; kill every rank still running at ``timeout`` seconds."""
    run_script(script, world, lambda r, port: [*head, str(r), str(world), port, *tail],
               timeout=timeout)  # fmt: skip
