"""One launcher for the suite's multi-process tests: start ``world`` real ranks (forked from a
zygote that has imported torch, see zygote.py, or as subprocesses), bound them by a deadline,
and report a failing rank with the tail of its output.

Every multi-process test starts its ranks through here (the root conftest puts this folder on
``sys.path``), so a fix to how ranks are started, killed or reported lands once.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from zygote import Rank, Zygote


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (the rendezvous port of a test world)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class RankOutput:
    rank: int
    returncode: int | None  # None: still running at the deadline, then killed
    stdout: str
    stderr: str  # empty when stderr was merged into stdout


def world_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The parent's environment for a rank: one intra-op thread per rank (a world of two fits
    two cores), transformers quiet, plus ``extra``."""
    env = dict(os.environ, OMP_NUM_THREADS="1", TRANSFORMERS_VERBOSITY="error")
    env.update(extra or {})
    return env


def run_ranks(
    argv: Callable[[int], Sequence[str]],
    world: int,
    *,
    timeout: float,
    env: Mapping[str, str] | Callable[[int], Mapping[str, str]] | None = None,
    merge_stderr: bool = True,
    fork: bool = True,
) -> list[RankOutput]:
    """Start ``python *argv(rank)`` for every rank and wait for all of them; every rank still
    running ``timeout`` seconds after the start is killed (its ``returncode`` is None).

    ``fork=False`` starts fresh interpreters even where the zygote could fork the ranks: a
    forked rank ends with ``os._exit`` after its exit handlers, so a test of what the
    interpreter's own finalization does (a process group torn down at exit) needs a real one."""
    zygote = Zygote.get() if fork else None
    procs: list[Any] = []
    for rank in range(world):
        rank_env = env(rank) if callable(env) else env
        full_env = dict(rank_env) if rank_env is not None else world_env()
        args = [str(a) for a in argv(rank)]
        if zygote is not None and zygote.can_run(args, full_env):
            procs.append(zygote.start(args, full_env, merge_stderr=merge_stderr))
            continue
        procs.append(
            subprocess.Popen(
                [sys.executable, *args],
                env=full_env,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT if merge_stderr else subprocess.PIPE,
                text=True,
                errors="replace",
            )
        )
    deadline = time.monotonic() + timeout
    results = []
    try:
        for rank, p in enumerate(procs):
            left = max(0.1, deadline - time.monotonic())
            rc: int | None
            if isinstance(p, Rank):
                try:
                    rc = p.wait(timeout=left)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()
                    rc = None
                out, err = p.output()
            else:
                try:
                    out, err = p.communicate(timeout=left)
                    rc = p.returncode
                except subprocess.TimeoutExpired:
                    p.kill()
                    out, err = p.communicate()
                    rc = None
            results.append(RankOutput(rank, rc, out or "", err or ""))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    return results


def check_ranks(results: Sequence[RankOutput], what: str, tail: int = 6000) -> None:
    """Raise naming the first rank that failed or hung, with the end of its output."""
    for r in results:
        if r.returncode != 0:
            state = "timed out" if r.returncode is None else f"failed ({r.returncode})"
            text = (r.stdout + r.stderr)[-tail:]
            raise AssertionError(f"rank {r.rank} of {what} {state}:\n{text}")


def run_script(
    script: Path | str,
    world: int,
    args: Callable[[int, str], Sequence[str]],
    *,
    timeout: float,
    env: Mapping[str, str] | None = None,
) -> None:
    """Run ``script *args(rank, port)`` on ``world`` ranks sharing a fresh rendezvous port;
    raise when any rank fails or outlives ``timeout``."""
    port = str(free_port())
    base = world_env({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port, **(env or {})})
    results = run_ranks(lambda r: [str(script), *args(r, port)], world, timeout=timeout, env=base)
    check_ranks(results, Path(script).name)
