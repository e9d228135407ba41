"""Start a world of worker processes (real gloo process groups) and collect their results."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def run_world(scenario: str, world: int, out_dir: Path, timeout: float = 240.0, *args: str) -> dict:
    """Run ``_worker.py scenario`` on ``world`` ranks; returns rank 0's saved result dict."""
    port = free_port()
    env = dict(os.environ, OMP_NUM_THREADS="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    procs = []
    for rank in range(world):
        cmd = [
            sys.executable,
            str(HERE / "_worker.py"),
            scenario,
            str(rank),
            str(world),
            str(port),
            str(out_dir),
            *args,
        ]
        procs.append(
            subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        )
    outputs = []
    try:
        for p in procs:
            out, _ = p.communicate(timeout=timeout)
            outputs.append(out.decode(errors="replace"))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    for rank, (p, out) in enumerate(zip(procs, outputs)):
        if p.returncode != 0:
            raise AssertionError(
                f"rank {rank} of {scenario} failed ({p.returncode}):\n{out[-6000:]}"
            )
    return torch.load(out_dir / f"{scenario}.pt", weights_only=False)
