"""Uncaught ds errors print as one line, not a traceback.

A :class:`DsError` message already says what was wrong and how to fix it; the traceback through
library internals is noise for the user who mistyped a config key. ``DS_TRACEBACK=1`` restores the
full traceback. Only the interpreter's default hook is replaced, so IPython, pytest and any hook an
application installed are left alone.

An error class may name the process's exit status (``exit_code``) so that a script or scheduler
can tell that failure from the others without parsing stderr; the default is 1, Python's.
"""

from __future__ import annotations

import os
import sys
from types import TracebackType

from ds.interfaces.errors import DsError

_installed = False


def _hook(exc_type: type[BaseException], exc: BaseException, tb: TracebackType | None) -> None:
    if issubclass(exc_type, DsError) and os.environ.get("DS_TRACEBACK", "") in ("", "0"):
        msg = " ".join(str(exc).split("\n"))
        sys.stderr.write(f"ds: {exc_type.__name__}: {msg} (DS_TRACEBACK=1 shows the traceback)\n")
        sys.stderr.flush()
        code = getattr(exc, "exit_code", 1)
        if isinstance(code, int) and code != 1:
            sys.exit(code)  # raised in the hook: the interpreter exits with it, atexit still runs
        return
    sys.__excepthook__(exc_type, exc, tb)


def install() -> None:
    """Install the one-line hook if the interpreter still uses its default hook."""
    global _installed
    if _installed:
        return
    if sys.excepthook is sys.__excepthook__:
        sys.excepthook = _hook
    _installed = True
