"""Run a group with a restart budget and report the root cause when it finally fails."""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path
from typing import TextIO

from ds.interfaces.logging import configure_cli_logging, get_logger
from ds.launcher.procgroup import Failure, Member, Outcome, ProcessGroup, install_signal_forwarding
from ds.launcher.proctree import signal_name

log = get_logger(__name__)
_logging_ready = False


class Supervisor:
    def __init__(
        self,
        make_members: Callable[[int], list[Member]],
        max_restarts: int = 0,
        grace_s: float = 3.0,
        report_dir: Path | None = None,
        err: TextIO | None = None,
        name: str = "ds run",
        hang_timeout_s: float | None = None,
    ) -> None:
        self.make_members = make_members
        self.max_restarts = max_restarts
        self.grace_s = grace_s
        self.report_dir = report_dir
        self.err = err or sys.stderr
        self.name = name
        self.hang_timeout_s = hang_timeout_s
        self.group: ProcessGroup | None = None
        self.outcomes: list[Outcome] = []

    def run(self) -> int:
        install_signal_forwarding(lambda: self.group)
        restart = 0
        while True:
            members = self.make_members(restart)
            self.group = ProcessGroup(
                members,
                grace_s=self.grace_s,
                adopt_orphans=True,
                hang_timeout_s=self.hang_timeout_s,
            )
            started = time.monotonic()
            outcome = self.group.run()
            self.outcomes.append(outcome)
            if outcome.interrupted_by is not None:
                self._line(
                    f"received {signal_name(outcome.interrupted_by)}; stopped "
                    f"{len(members)} process(es) and their children"
                )
                return outcome.exit_code
            if outcome.ok:
                return 0
            assert outcome.failure is not None
            self.report(outcome, time.monotonic() - started, restart)
            self._log_failure(outcome, restart)
            if restart >= self.max_restarts:
                return outcome.exit_code
            restart += 1
            self._line(f"restarting the whole group ({restart}/{self.max_restarts})")

    def _log_failure(self, outcome: Outcome, restart: int) -> None:
        f = outcome.failure
        assert f is not None
        if not self.err.isatty():
            # The JSON line structlog would render, written directly: importing structlog took
            # over a second on a loaded machine, inside the 5 s the whole teardown is allowed.
            line = {
                "member": f.label,
                "pid": f.pid,
                "returncode": f.returncode,
                **({"hang": f.hang} if f.hang is not None else {}),
                "restart": restart,
                "restarts_left": max(0, self.max_restarts - restart),
                "event": "member_failed",
                "rank": 0,
                "world_size": 1,
                "level": "error",
                "logger": __name__,
                "timestamp": datetime.now(timezone.utc).isoformat().replace("+00:00", "Z"),
            }
            print(json.dumps(line), file=self.err, flush=True)
            return
        # Configured here, not at start-up: structlog costs ~0.1 s to import and a job that
        # succeeds never needs it in the launcher process.
        global _logging_ready
        if not _logging_ready:
            configure_cli_logging()
            _logging_ready = True
        log.error(
            "member_failed",
            member=f.label,
            pid=f.pid,
            returncode=f.returncode,
            **({"hang": f.hang} if f.hang is not None else {}),
            restart=restart,
            restarts_left=max(0, self.max_restarts - restart),
        )

    def _line(self, text: str) -> None:
        print(f"{self.name}: {text}", file=self.err, flush=True)

    def report(self, outcome: Outcome, elapsed_s: float, restart: int) -> None:
        f = outcome.failure
        assert f is not None
        how = "hung" if f.hang is not None else "failed first"
        self._line(f"{f.label} (pid {f.pid}) {how}: {f.describe()}")
        if outcome.stopped:
            self._line(f"stopped the other process(es): {', '.join(outcome.stopped)}")
        if f.tail:
            self._line(f"last {len(f.tail)} line(s) of {f.label} output:")
            for line in f.tail:
                print(f"    {line}", file=self.err)
        if f.log_path is not None:
            self._line(f"full log of {f.label}: {f.log_path}")
        self.err.flush()
        if self.report_dir is not None:
            self._write_json(f, outcome, elapsed_s, restart)

    def _write_json(self, f: Failure, outcome: Outcome, elapsed_s: float, restart: int) -> None:
        assert self.report_dir is not None
        self.report_dir.mkdir(parents=True, exist_ok=True)
        data = {
            "failed": f.label,
            "pid": f.pid,
            "returncode": f.returncode,
            "exit_code": f.exit_code,
            "signal": signal_name(-f.returncode) if f.returncode < 0 else None,
            "hang": f.hang,
            "stopped": outcome.stopped,
            "tail": f.tail,
            "log": str(f.log_path) if f.log_path else None,
            "restart": restart,
            "elapsed_s": round(elapsed_s, 3),
        }
        suffix = f".restart{restart}" if restart else ""
        path = self.report_dir / f"failure{suffix}.json"
        path.write_text(json.dumps(data, indent=2) + "\n")
