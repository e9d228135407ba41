"""Helpers for launching real jobs with the ``ds`` console script."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPTS = Path(__file__).parent / "scripts"


def ds_command() -> list[str]:
    exe = Path(sys.executable).parent / "ds"
    if exe.exists():
        return [str(exe)]
    found = shutil.which("ds")
    return [found] if found else [sys.executable, "-m", "ds.launcher.cli"]


def clean_env(**extra: str) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if k
        not in (
            "RANK",
            "WORLD_SIZE",
            "LOCAL_RANK",
            "MASTER_ADDR",
            "MASTER_PORT",
            "OMP_NUM_THREADS",
            "MKL_NUM_THREADS",
            "DS_HOSTFILE",
            "DS_ENV_FILE",
        )
    }
    env.update(extra)
    return env


@pytest.fixture
def scripts() -> Path:
    return SCRIPTS


@pytest.fixture
def env_for():  # type: ignore[no-untyped-def]
    return clean_env


@pytest.fixture
def run_ds(tmp_path: Path):  # type: ignore[no-untyped-def]
    def _run(
        *args: str, timeout: float = 120, env: dict[str, str] | None = None, cwd: Path | None = None
    ) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*ds_command(), "run", *args],
            capture_output=True,
            text=True,
            timeout=timeout,
            env=env or clean_env(),
            cwd=cwd or tmp_path,
        )

    return _run
