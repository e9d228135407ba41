"""Start a world of ``_worker.py`` ranks (real gloo process groups) and collect rank 0's result."""

from __future__ import annotations

from pathlib import Path

import torch
from world import run_script

HERE = Path(__file__).resolve().parent


def run_world(scenario: str, world: int, out_dir: Path, timeout: float = 240.0, *args: str) -> dict:
    """Run ``_worker.py scenario`` on ``world`` ranks; returns rank 0's saved result dict."""
    run_script(
        HERE / "_worker.py",
        world,
        lambda r, port: [scenario, str(r), str(world), port, str(out_dir), *args],
        timeout=timeout,
    )
    return torch.load(out_dir / f"{scenario}.pt", weights_only=False)
