"""Start the ranks of a stage-3 scenario as subprocesses and collect their results."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from world import run_script

WORKER = Path(__file__).with_name("stage3_worker.py")


def run_ranks(
    cases: list[dict[str, Any]], world: int, out_dir: Path, timeout: float = 180
) -> list[Any]:
    """Run ``world`` ranks; return per-rank results or raise with the failing rank's output."""
    run_script(
        WORKER,
        world,
        lambda r, port: [str(r), str(world), port, json.dumps(cases), str(out_dir)],
        timeout=timeout,
    )
    return [torch.load(out_dir / f"rank{r}.pt") for r in range(world)]


def load_worker() -> Any:
    import importlib.util

    spec = importlib.util.spec_from_file_location("stage3_worker", WORKER)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod
