"""The README's main job as the tests start it: ``ds run --nproc 2 examples/train_gpt.py`` with
the ZeRO-2 config, through the ``ds`` console script of the interpreter running the tests."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DS = Path(sys.executable).parent / "ds"


def ds_run(*args: str | Path, nproc: int = 2) -> list[str]:
    """``ds run --nproc <nproc> <args>``."""
    return [str(DS), "run", "--nproc", str(nproc), *map(str, args)]


def main_job(steps: int, out: Path) -> list[str]:
    """The main job for ``steps`` steps, writing its checkpoints and ledger under ``out``."""
    examples = ROOT / "examples"
    config = examples / "ds_config_zero2.json"
    return ds_run(
        examples / "train_gpt.py", "--config", config, "--steps", str(steps), "--out", out
    )
