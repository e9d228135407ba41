"""The hang watchdog never turns a finished job into a crash at interpreter shutdown."""

from __future__ import annotations

import subprocess
import sys

import pytest

from .conftest import WORKERS, _base_env, free_port


@pytest.mark.multiprocess
@pytest.mark.timeout(240)
def test_exit_while_heartbeat_publishes_is_clean() -> None:
    # Unguarded, about three exits in four abort here (SIGABRT); five clean runs in a row make
    # a regression all but certain to show.
    for attempt in range(5):
        env = _base_env()
        env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), RANK="0", WORLD_SIZE="1")
        proc = subprocess.run(
            [sys.executable, str(WORKERS / "watchdog_exit.py")],
            env=env,
            capture_output=True,
            text=True,
            timeout=40,
        )
        assert proc.returncode == 0, (
            f"attempt {attempt}: rc {proc.returncode}\n{proc.stderr[-2000:]}"
        )
        assert proc.stdout.strip().endswith("done")
