"""Start a gloo world running ``_tp_worker.py`` and return rank 0's result."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from world import run_script

HERE = Path(__file__).resolve().parent


def run_world(scenario: str, world: int, out: Path, *args: str, timeout: float = 120.0) -> Any:
    run_script(
        HERE / "_tp_worker.py",
        world,
        lambda r, port: [scenario, str(r), str(world), port, str(out), *args],
        timeout=timeout,
    )
    return torch.load(out / "result.pt", weights_only=False)
