"""Run a group of processes as one job: all succeed, or all are stopped together.

Each member (a rank, or a remote runner command) starts in its own session so that its whole
process tree can be signalled. A waiter thread per member records the exit time, so the member that
failed *first* is known even when several fail within one polling interval. When a member exits
non-zero, or the launcher receives SIGINT/SIGTERM, every other member gets SIGTERM and, after a
grace period, SIGKILL (whole process group plus descendants that escaped it).
"""

from __future__ import annotations

import contextlib
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

import psutil  # type: ignore[import-untyped]

from ds.interfaces.errors import LaunchError
from ds.launcher.hangwatch import HANG_EXIT_CODE, HangWatch
from ds.launcher.proctree import (
    alive,
    become_subreaper,
    descendants,
    parent_death_signal,
    reap,
    signal_name,
    signal_tree,
)

TAIL_LINES = 20


@dataclass
class Member:
    """One process to start: ``label`` names it in reports ("rank 1"), ``prefix`` tags its output."""

    label: str
    argv: Sequence[str]
    env: dict[str, str]
    prefix: str = ""
    log_path: Path | None = None
    cpus: Sequence[int] | None = None  # core binding (os.sched_setaffinity), None = inherit
    stdin_pipe: bool = False  # keep a pipe open: remote agents stop when it closes


@dataclass
class Failure:
    label: str
    pid: int
    returncode: int
    tail: list[str]
    log_path: Path | None
    hang: str | None = None  # set when the member was stopped for a collective that hung

    @property
    def exit_code(self) -> int:
        """The code the launcher exits with: the member's code, 128+N for signal N, or 124
        for a collective that hung."""
        if self.hang is not None:
            return HANG_EXIT_CODE
        return 128 - self.returncode if self.returncode < 0 else self.returncode

    def describe(self) -> str:
        if self.hang is not None:
            return self.hang
        if self.returncode < 0:
            return f"killed by signal {signal_name(-self.returncode)} ({-self.returncode})"
        return f"exit code {self.returncode}"


@dataclass
class Outcome:
    exit_code: int
    failure: Failure | None = None
    interrupted_by: int | None = None  # signal number received by the launcher
    stopped: list[str] = field(default_factory=list)  # labels of members we had to stop

    @property
    def ok(self) -> bool:
        return self.exit_code == 0


class _Running:
    def __init__(self, member: Member, proc: subprocess.Popen[bytes], log: IO[bytes] | None):
        self.member = member
        self.proc = proc
        self.log = log
        self.tail: deque[str] = deque(maxlen=TAIL_LINES)
        self.pumps: list[threading.Thread] = []
        self.returncode: int | None = None


class _Console:
    """Serialises prefixed lines from many pump threads onto the launcher's stdout/stderr."""

    def __init__(self) -> None:
        self.lock = threading.Lock()

    def write(self, stream: IO[bytes], data: bytes) -> None:
        with self.lock:
            try:
                stream.write(data)
                stream.flush()
            except (BrokenPipeError, ValueError):
                pass


def _pump(src: IO[bytes], dst: IO[bytes], run: _Running, prefix: bytes, console: _Console) -> None:
    for line in iter(src.readline, b""):
        if not line.endswith(b"\n"):
            line += b"\n"
        console.write(dst, prefix + line)
        if run.log is not None:
            with console.lock:
                run.log.write(line)
                run.log.flush()
        run.tail.append(line.decode("utf-8", "replace").rstrip("\n"))
    src.close()


class ProcessGroup:
    """Start ``members``, wait, and tear everything down on the first failure or signal."""

    def __init__(
        self,
        members: Sequence[Member],
        grace_s: float = 3.0,
        adopt_orphans: bool = False,
        hang_timeout_s: float | None = None,
    ) -> None:
        if not members:
            raise LaunchError("nothing to launch: the job has no ranks")
        self.members = list(members)
        self.grace_s = grace_s
        self._events: queue.Queue[tuple[int, float]] = queue.Queue()
        self._signal: int | None = None
        self._running: list[_Running] = []
        self._hang_text = ""
        self._console = _Console()
        # Only a process whose sole children are the members may sweep all its descendants.
        self.adopt_orphans = adopt_orphans and become_subreaper()
        # Ranks die with the launcher even when it is SIGKILLed and cannot stop them itself.
        self._pdeathsig = parent_death_signal()
        # Members are ranks (not runner processes) whose collectives are watched.
        self._hangs = HangWatch(hang_timeout_s) if hang_timeout_s else None

    # signals -----------------------------------------------------------------
    def request_stop(self, signum: int) -> None:
        """Called from the launcher's signal handler: forward to ranks and stop the group."""
        if self._signal is None:
            self._signal = signum
        for run in self._running:
            if run.returncode is None:
                signal_tree(run.proc.pid, signum, descendants(run.proc.pid))

    # lifecycle ---------------------------------------------------------------
    def _start(self, idx: int, member: Member) -> _Running:
        log: IO[bytes] | None = None
        if member.log_path is not None:
            member.log_path.parent.mkdir(parents=True, exist_ok=True)
            log = open(member.log_path, "ab")  # noqa: SIM115 - closed in _finish
        try:
            proc = subprocess.Popen(
                list(member.argv),
                env=self._hangs.rank_env(idx, member.env) if self._hangs else member.env,
                stdin=subprocess.PIPE if member.stdin_pipe else subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                start_new_session=True,
                preexec_fn=self._pdeathsig,  # a single C call, resolved before fork
            )
        except OSError as exc:
            if log is not None:
                log.close()
            raise LaunchError(
                f"cannot start {member.label}: {member.argv[0]!r}: {exc.strerror}"
            ) from None
        if member.cpus is not None:
            # exec() has completed when Popen returns, so the interpreter has not started any
            # thread yet; threads created later (OpenMP, gloo) inherit this mask.
            with contextlib.suppress(OSError):
                os.sched_setaffinity(proc.pid, member.cpus)
        run = _Running(member, proc, log)
        prefix = member.prefix.encode()
        out = sys.stdout.buffer
        err = sys.stderr.buffer
        assert proc.stdout is not None and proc.stderr is not None
        for src, dst in ((proc.stdout, out), (proc.stderr, err)):
            t = threading.Thread(
                target=_pump, args=(src, dst, run, prefix, self._console), daemon=True
            )
            t.start()
            run.pumps.append(t)
        waiter = threading.Thread(target=self._wait, args=(idx, proc), daemon=True)
        waiter.start()
        return run

    def _wait(self, idx: int, proc: subprocess.Popen[bytes]) -> None:
        proc.wait()
        self._events.put((idx, time.monotonic()))

    def run(self) -> Outcome:
        try:
            for i, m in enumerate(self.members):
                self._running.append(self._start(i, m))
                if self._signal is not None:
                    break
        except LaunchError:
            self._terminate_all()
            self._finish()
            raise
        failure: Failure | None = None
        failed: _Running | None = None
        remaining = len(self._running)
        if self._signal is not None:
            self.request_stop(self._signal)
        while remaining:
            try:
                idx, _t = self._events.get(timeout=0.1)
            except queue.Empty:
                if self._signal is not None:
                    break
                failed = self._hung()
                if failed is not None:
                    m = failed.member
                    failure = Failure(m.label, failed.proc.pid, 0, [], m.log_path, self._hang_text)
                    break
                continue
            remaining -= 1
            run = self._running[idx]
            run.returncode = run.proc.returncode
            if run.returncode != 0 and failure is None and self._signal is None:
                failed = run
                failure = Failure(
                    run.member.label, run.proc.pid, run.returncode, [], run.member.log_path
                )
                break
        stopped = self._terminate_all()
        # Only now are the output pipes sure to close: a descendant that ignored SIGTERM (even
        # one that left the rank's session) may hold them open until its SIGKILL. Waiting for the
        # failed rank's last words before stopping the others cost up to 1 s per pipe.
        self._finish()
        if failure is not None and failed is not None:
            failure.tail[:] = list(failed.tail)
            if failure.hang is not None and failed.proc.returncode is not None:
                failure.returncode = failed.proc.returncode  # how it ended once stopped
        if self._signal is not None:
            return Outcome(128 + self._signal, None, self._signal, stopped)
        if failure is not None:
            return Outcome(failure.exit_code, failure, None, stopped)
        return Outcome(0, None, None, stopped)

    def _hung(self) -> _Running | None:
        """The member stuck in one collective past the hang timeout, if any."""
        if self._hangs is None:
            return None
        runs = self._running
        hang = self._hangs.check(
            [r.member.label for r in runs], [r.proc.poll() is None for r in runs]
        )
        if hang is None:
            return None
        self._hang_text = self._hangs.describe(hang)
        return runs[hang.index]

    def _terminate_all(self) -> list[str]:
        """SIGTERM every live member tree, SIGKILL what is left after the grace period."""
        stopped: list[str] = []
        trees: list[tuple[_Running, list[psutil.Process]]] = []
        for run in self._running:
            kids = descendants(run.proc.pid)
            if run.proc.poll() is None:
                stopped.append(run.member.label)
            trees.append((run, kids))
            signal_tree(run.proc.pid, signal.SIGTERM, kids)
        orphans = self._orphans()
        for p in orphans:
            with contextlib.suppress(psutil.Error):
                p.terminate()
        deadline = time.monotonic() + self.grace_s
        while time.monotonic() < deadline:
            if all(r.proc.poll() is not None and not alive(k) for r, k in trees) and not alive(
                orphans
            ):
                break
            reap(orphans)
            time.sleep(0.02)
        for run, kids in trees:
            signal_tree(run.proc.pid, signal.SIGKILL, alive(kids))
        for p in alive(orphans):
            with contextlib.suppress(psutil.Error):
                p.kill()
        for run, _ in trees:
            with contextlib.suppress(subprocess.TimeoutExpired):
                run.proc.wait(timeout=2.0)
            if run.returncode is None:
                run.returncode = run.proc.returncode
        reap(orphans)
        return stopped

    def _orphans(self) -> list[psutil.Process]:
        """Adopted descendants that left every member's tree (their parent rank died)."""
        if not self.adopt_orphans:
            return []
        own = {r.proc.pid for r in self._running}
        for r in self._running:
            own.update(p.pid for p in descendants(r.proc.pid))
        return [p for p in descendants(os.getpid()) if p.pid not in own]

    def _finish(self) -> None:
        if self._hangs is not None:
            self._hangs.close()
        for run in self._running:
            for p in run.pumps:
                p.join(timeout=1.0)
            if run.proc.stdin is not None:
                with contextlib.suppress(OSError):
                    run.proc.stdin.close()
            if run.log is not None:
                run.log.close()


def install_signal_forwarding(get_group: Callable[[], ProcessGroup | None]) -> None:
    """Forward SIGINT/SIGTERM/SIGHUP received by the launcher to the current group."""

    def handler(signum: int, _frame: object) -> None:
        group = get_group()
        if group is not None:
            group.request_stop(signum)
        else:
            raise SystemExit(128 + signum)

    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, handler)
