"""Start a gloo world of ``script`` (argv: rank world port *args) and wait for every rank."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from _tp_launch import free_port


def run_ranks(script: Path, world: int, args: list[str], timeout: float) -> None:
    """Raises with the failing rank's output tail when any rank exits non-zero."""
    port = str(free_port())
    env = dict(os.environ, OMP_NUM_THREADS="1", TRANSFORMERS_VERBOSITY="error")
    procs = [
        subprocess.Popen(
            [sys.executable, str(script), str(r), str(world), port, *args],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        for r in range(world)
    ]
    texts = []
    try:
        for p in procs:
            texts.append(p.communicate(timeout=timeout)[0].decode(errors="replace"))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    for rank, (p, text) in enumerate(zip(procs, texts)):
        assert p.returncode == 0, f"rank {rank} failed ({p.returncode}):\n{text[-5000:]}"
