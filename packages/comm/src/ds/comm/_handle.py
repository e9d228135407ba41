"""Waitable handles returned by ``async_op=True`` calls.

A thin wrapper over the backend's work object: ``wait`` accepts seconds (the Protocol's spelling) or
a ``timedelta`` (torch's), and runs the post-processing some emulated collectives need (e.g. the
division of an emulated AVG) exactly once. Unknown attributes fall through to the torch work, so
code that calls ``get_future()`` keeps working.
"""

from __future__ import annotations

import datetime
from collections.abc import Callable
from typing import Any


def as_timedelta(timeout: float | datetime.timedelta) -> datetime.timedelta:
    if isinstance(timeout, datetime.timedelta):
        return timeout
    return datetime.timedelta(seconds=float(timeout))


class Handle:
    """Returned by every ``async_op=True`` collective of :mod:`ds.comm`."""

    __slots__ = ("_after", "_work")

    def __init__(self, work: Any, after: Callable[[], None] | None = None) -> None:
        self._work = work
        self._after = after

    def wait(self, timeout: float | datetime.timedelta | None = None) -> bool:
        if timeout is None:
            self._work.wait()
        else:
            try:
                self._work.wait(as_timedelta(timeout))
            except RuntimeError:
                # Timed out (or failed) with the collective perhaps still pending in the backend:
                # releasing its group would join it (see ds.comm._abandon).
                from ds.comm._abandon import abandon_all

                abandon_all("wait")
                raise
        after, self._after = self._after, None
        if after is not None:
            after()
        return True

    def is_completed(self) -> bool:
        return bool(self._work.is_completed())

    def __getattr__(self, name: str) -> Any:
        return getattr(self._work, name)


class DoneHandle:
    """A handle for work that already finished (ops emulated synchronously)."""

    __slots__ = ()

    def wait(self, timeout: float | datetime.timedelta | None = None) -> bool:
        return True

    def is_completed(self) -> bool:
        return True


def wrap(work: Any, after: Callable[[], None] | None = None) -> Handle | None:
    """Wrap an async torch work (``None`` stays ``None``: the rank is not in the group)."""
    if work is None:
        if after is not None:
            after()
        return None
    return Handle(work, after)
