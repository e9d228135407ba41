"""Launcher side of ``--collective_timeout``: end a job whose torch.distributed collective hangs.

Each rank reports the collective it is in and since when (see ``_rankhook/sitecustomize.py``) to
a heartbeat file in a directory the launcher owns; :class:`HangWatch` reads the files and names
the rank that has waited longest once it has waited past the timeout. What the other ranks were
doing goes in the same report: the rank that never arrived is the one that is elsewhere.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

HOOK_DIR = str(Path(__file__).parent / "_rankhook")
EXIT = "<exit>"  # what a rank reports once its script has ended and its interpreter shuts down
HANG_EXIT_CODE = 124  # as coreutils' timeout: the job was stopped because it made no progress
ENV_VAR = "DS_COLLECTIVE_TIMEOUT"


def parse_timeout(value: str | float | None, source: str) -> float | None:
    """Seconds from the flag or the environment; None when off (absent or 0)."""
    if value is None or value == "":
        return None
    try:
        seconds = float(value)
    except ValueError:
        seconds = math.nan
    if not seconds >= 0 or math.isinf(seconds):
        raise ValueError(
            f"{source} {value!r}: expected seconds > 0 (e.g. 600), or 0 to switch the hang "
            "timeout off"
        )
    return seconds or None


@dataclass
class Hang:
    """The rank that waited longest in one collective, and where every other rank was."""

    index: int
    op: str
    waited_s: float
    others: list[str]


class HangWatch:
    def __init__(self, timeout_s: float) -> None:
        self.timeout_s = timeout_s
        self.poll_s = min(0.5, timeout_s / 4)
        self.dir = Path(tempfile.mkdtemp(prefix="ds_heartbeat."))
        self._next_check = 0.0

    def rank_env(self, index: int, env: dict[str, str]) -> dict[str, str]:
        """``env`` plus what makes the rank's interpreter report its collectives."""
        out = dict(env)
        out["DS_HEARTBEAT_FILE"] = str(self.dir / f"member{index}.json")
        out["DS_HEARTBEAT_POLL"] = f"{self.poll_s:g}"
        path = env.get("PYTHONPATH")
        out["PYTHONPATH"] = HOOK_DIR + (os.pathsep + path if path else "")
        return out

    def _state(self, index: int) -> tuple[str, float] | None:
        try:
            data = json.loads((self.dir / f"member{index}.json").read_text())
        except (OSError, ValueError):
            return None
        op, since = data.get("op"), data.get("since")
        if isinstance(op, str) and isinstance(since, (int, float)):
            return op, float(since)
        return None

    def check(self, labels: Sequence[str], alive: Sequence[bool]) -> Hang | None:
        """The hang to report, if a live member has been in one collective past the timeout."""
        now = time.monotonic()
        if now < self._next_check:
            return None
        self._next_check = now + self.poll_s
        states = [self._state(i) if alive[i] else None for i in range(len(labels))]
        waiting = [(s[1], i) for i, s in enumerate(states) if s is not None]
        if not waiting:
            return None
        since, index = min(waiting)
        if now - since <= self.timeout_s:
            return None
        others = []
        for i, label in enumerate(labels):
            if i == index:
                continue
            s = states[i]
            if not alive[i]:
                others.append(f"{label} exited")
            elif s is None:
                others.append(f"{label} not in a collective")
            else:
                others.append(f"{label} {_where(s[0])} for {now - s[1]:.1f} s")
        return Hang(index, states[index][0], now - since, others)  # type: ignore[index]

    def describe(self, hang: Hang) -> str:
        text = (
            f"no progress for {hang.waited_s:.1f} s {_where(hang.op)} "
            f"(--collective_timeout {self.timeout_s:g})"
        )
        if hang.others:
            text += f"; meanwhile {', '.join(hang.others)}"
        return text

    def close(self) -> None:
        shutil.rmtree(self.dir, ignore_errors=True)


def _where(op: str) -> str:
    if op == EXIT:
        return "in interpreter exit, after its script ended"
    return f"in torch.distributed {op}"
