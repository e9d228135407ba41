"""A process group whose collective timed out is abandoned, so that the process can still exit.

A bounded wait on a collective (``work.wait(timeout)``) gives up in the calling thread, but the
backend keeps the collective: gloo runs it on the group's worker thread, which stays blocked in
the transport until the group's own timeout (30 minutes by default). ``ProcessGroupGloo``'s
destructor joins that thread, and it runs when the group is released: at interpreter exit, on
``destroy_process_group``, or whenever the last reference goes. So a rank that raised
:class:`CollectiveTimeoutError` hung at exit (``sys.exit(1)`` too; only ``os._exit`` ended it),
and ``ds run`` never saw it fail.

:func:`abandon` takes one extra reference to the group's Python object that is never dropped:
the group is never destroyed, its threads are never joined and the operating system ends them
with the process, which then exits with the code the program chose (1 for the uncaught error).
``gloo``'s ``abort()`` does not help here: it returns without waking the blocked thread.
"""

from __future__ import annotations

import ctypes
import threading
from typing import Any

import torch.distributed as _dist

from ds.interfaces.logging import get_logger

log = get_logger(__name__)

_lock = threading.Lock()
_abandoned: dict[int, str] = {}  # id(process group) -> the collective that never completed


def _resolve(group: Any) -> Any:
    if group is not None and group is not _dist.GroupMember.WORLD:
        return group
    try:
        return _dist.distributed_c10d._get_default_group()
    except (RuntimeError, ValueError):  # already destroyed: nothing left to join
        return None


def abandon(group: Any, op: str) -> None:
    """Never release ``group`` (a collective ``op`` on it timed out and may still be pending)."""
    pg = _resolve(group)
    if pg is None:
        return
    with _lock:
        if id(pg) in _abandoned:
            return
        _abandoned[id(pg)] = op
        # The reference is taken in C and has no owner, so neither interpreter shutdown nor
        # destroy_process_group can bring the count to zero and run the joining destructor.
        ctypes.pythonapi.Py_IncRef(ctypes.py_object(pg))
    log.warning(
        "process group abandoned after a collective timed out; exit the process",
        op=op,
        group=getattr(pg, "group_name", "?"),
    )


def abandon_all(op: str) -> None:
    """:func:`abandon` every group of this process: for a wait whose group is not known."""
    world = getattr(_dist.distributed_c10d, "_world", None)
    groups = list(getattr(world, "pg_map", {}) or {}) if world is not None else []
    for pg in [None, *groups]:
        abandon(pg, op)


def abandoned() -> list[str]:
    """The collectives whose groups were abandoned in this process (for tests and reports)."""
    with _lock:
        return list(_abandoned.values())
