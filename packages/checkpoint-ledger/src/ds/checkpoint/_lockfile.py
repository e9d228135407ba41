"""One writer per ledger file: an advisory lock on ``<ledger>.lock`` that names its holder.

``flock`` is held on an open file description, so it is released when the holder closes the file
or dies (even by SIGKILL) and never goes stale. The holder writes its pid into the lock file so a
refused writer can say who holds it; the pid is informational, the lock is the flock.
"""

from __future__ import annotations

import os

from ds.interfaces.errors import LedgerError


def lock_path(path: str) -> str:
    return path + ".lock"


class WriterLock:
    """Exclusive, non-blocking lock for the single writer of ``path``; ``release()`` drops it."""

    def __init__(self, path: str) -> None:
        import fcntl

        self.path = lock_path(path)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            holder = _read_holder(fd)
            os.close(fd)
            who = f"process {holder}" if holder else "another process"
            raise LedgerError(
                f"ledger {path} is open for writing by {who} (lock {self.path}); one writer per "
                "ledger: close it there, or open a different path"
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._fd: int | None = fd

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing the description drops the flock
            self._fd = None


def _read_holder(fd: int) -> str:
    try:
        return os.pread(fd, 32, 0).decode(errors="replace").strip()
    except OSError:
        return ""
