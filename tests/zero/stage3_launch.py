"""Start the ranks of a stage-3 scenario as subprocesses and collect their results."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import torch

WORKER = Path(__file__).with_name("stage3_worker.py")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def run_ranks(
    cases: list[dict[str, Any]], world: int, out_dir: Path, timeout: float = 180
) -> list[Any]:
    """Run ``world`` ranks; return per-rank results or raise with the ranks' stderr."""
    port = free_port()
    env = dict(os.environ, OMP_NUM_THREADS="1")
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                str(WORKER),
                str(r),
                str(world),
                str(port),
                json.dumps(cases),
                str(out_dir),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        for r in range(world)
    ]
    errs = []
    for p in procs:
        try:
            _, err = p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            raise
        errs.append(err)
    if any(p.returncode for p in procs):
        raise RuntimeError(
            "\n".join(
                f"rank {r} rc={p.returncode}:\n{e[-3000:]}"
                for r, (p, e) in enumerate(zip(procs, errs))
            )
        )
    return [torch.load(out_dir / f"rank{r}.pt") for r in range(world)]


def load_worker() -> Any:
    import importlib.util

    spec = importlib.util.spec_from_file_location("stage3_worker", WORKER)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod
