"""Uncaught ds errors print as one line, not a traceback.

A :class:`DsError` message already says what was wrong and how to fix it; the traceback through
library internals is noise for the user who mistyped a config key. ``DS_TRACEBACK=1`` restores the
full traceback. Only the interpreter's default hook is replaced, so IPython, pytest and any hook an
application installed are left alone.
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
