"""Start the ranks of a sequence-parallel worker script as subprocesses, bounded in time."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def run_ranks(script: Path, world: int, head: list[str], tail: list[str], timeout: float) -> None:
    """Run ``script *head RANK WORLD PORT *tail`` for each rank; raise with the log of a failed
    rank; kill every rank still running at ``timeout`` seconds."""
    port = free_port()
    env = dict(os.environ, OMP_NUM_THREADS="1")
    procs = [
        subprocess.Popen(
            [sys.executable, str(script), *head, str(r), str(world), str(port), *tail],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        for r in range(world)
    ]
    logs = []
    try:
        for p in procs:
            logs.append(p.communicate(timeout=timeout)[0].decode(errors="replace"))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    for r, (p, log) in enumerate(zip(procs, logs)):
        if p.returncode != 0:
            raise AssertionError(
                f"rank {r} of {script.name} failed ({p.returncode}):\n{log[-6000:]}"
            )
