"""Start a gloo world running ``_tp_worker.py`` and return rank 0's result."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import torch

HERE = Path(__file__).resolve().parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def run_world(scenario: str, world: int, out: Path, *args: str, timeout: float = 120.0) -> Any:
    port = free_port()
    env = dict(os.environ, OMP_NUM_THREADS="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    env["TRANSFORMERS_VERBOSITY"] = "error"
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                str(HERE / "_tp_worker.py"),
                scenario,
                str(r),
                str(world),
                str(port),
                str(out),
                *args,
            ],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        for r in range(world)
    ]
    outputs = []
    try:
        for p in procs:
            text, _ = p.communicate(timeout=timeout)
            outputs.append(text.decode(errors="replace"))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    for rank, (p, text) in enumerate(zip(procs, outputs)):
        if p.returncode != 0:
            raise AssertionError(
                f"rank {rank} of {scenario} failed ({p.returncode}):\n{text[-6000:]}"
            )
    return torch.load(out / "result.pt", weights_only=False)
