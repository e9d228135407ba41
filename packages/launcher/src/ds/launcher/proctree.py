"""Signalling whole process trees: a rank's own process group plus any descendant that left it."""

from __future__ import annotations

import contextlib
import os
import signal
import sys
from collections.abc import Callable

import psutil  # type: ignore[import-untyped]


def become_subreaper() -> bool:
    """Make this process adopt orphaned descendants (Linux PR_SET_CHILD_SUBREAPER).

    A rank that dies first leaves its daemonised children to be re-parented; as a subreaper the
    launcher inherits them instead of init, so it can still find and stop them.
    """
    if not sys.platform.startswith("linux"):
        return False
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        return int(libc.prctl(36, 1, 0, 0, 0)) == 0  # 36 = PR_SET_CHILD_SUBREAPER
    except (OSError, AttributeError):
        return False


def parent_death_signal() -> Callable[[], None] | None:
    """A pre-exec hook that makes a child receive SIGKILL when the launcher dies (Linux).

    The prctl function is resolved here, in the parent, so the hook run between fork and exec is a
    single C call.
    """
    if not sys.platform.startswith("linux"):
        return None
    try:
        import ctypes

        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None

    def hook() -> None:
        prctl(1, signal.SIGKILL, 0, 0, 0)  # 1 = PR_SET_PDEATHSIG

    return hook


def reap(procs: list[psutil.Process]) -> None:
    """Collect the exit status of adopted orphans so they do not linger as zombies."""
    for p in procs:
        with contextlib.suppress(psutil.Error, ChildProcessError):
            p.wait(timeout=0)


def descendants(pid: int) -> list[psutil.Process]:
    try:
        return list(psutil.Process(pid).children(recursive=True))
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return []


def signal_tree(pid: int, sig: int, known: list[psutil.Process] | None = None) -> None:
    """Send ``sig`` to the process group led by ``pid`` and to every known descendant.

    Ranks start in their own session, so the group covers children that stayed in it; the explicit
    descendant list covers children that called setsid() to escape.
    """
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)
    for proc in known or []:
        with contextlib.suppress(psutil.NoSuchProcess, psutil.AccessDenied):
            proc.send_signal(sig)


def alive(procs: list[psutil.Process]) -> list[psutil.Process]:
    out = []
    for p in procs:
        try:
            if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                out.append(p)
        except psutil.NoSuchProcess:
            pass
    return out


def group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def signal_name(sig: int) -> str:
    try:
        return signal.Signals(sig).name
    except ValueError:
        return f"signal {sig}"
