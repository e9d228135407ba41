"""Rank side of ``ds run --collective_timeout``: report which torch.distributed collective a rank
is in, and since when, so that the launcher can end a job whose collective never completes.

``ds run`` puts this directory first on ``PYTHONPATH`` and names a heartbeat file in
``DS_HEARTBEAT_FILE``; Python imports ``sitecustomize`` at start-up, so the rank's interpreter
starts one daemon thread here before the user's script runs. Every ``DS_HEARTBEAT_POLL`` seconds
the thread looks at every other thread's Python stack; a thread inside a public function of
``torch/distributed/distributed_c10d.py`` (``all_reduce``, ``barrier``, ``send``, ...) is in that
collective, and the same frame seen again is the same call. When the state changes it writes
``{"pid", "op", "since"}`` (``since`` on the system-wide monotonic clock, ``op`` null when no
collective is running, ``<exit>`` once the interpreter shuts down) to the heartbeat file,
atomically. Nothing is patched and torch is not
imported: a script that never uses torch.distributed pays for one idle thread.

The two variables are removed from the environment and this directory from ``sys.path`` and
``PYTHONPATH`` straight away, so the script, its imports and its child processes see the
environment the user gave; a ``sitecustomize`` of the user's own, later on the path, still runs.
Standard library only, so any Python interpreter the rank uses can load it.
"""

from __future__ import annotations

import atexit
import importlib
import json
import os
import sys
import threading
import time
from types import FrameType

_C10D = os.sep + os.path.join("torch", "distributed", "distributed_c10d.py")
EXIT = "<exit>"  # the state once the script has ended and the interpreter shuts down


def _collective(frame: FrameType | None) -> FrameType | None:
    """The outermost public distributed_c10d frame on this stack (the call the user made)."""
    found = None
    while frame is not None:
        code = frame.f_code
        if code.co_filename.endswith(_C10D) and not code.co_name.startswith("_"):
            found = frame
        frame = frame.f_back
    return found


def _write(path: str, state: tuple[str, float] | None) -> None:
    op, since = state if state is not None else (None, None)
    tmp = f"{path}.tmp"
    try:
        with open(tmp, "w") as f:
            json.dump({"pid": os.getpid(), "op": op, "since": since}, f)
        os.replace(tmp, path)
    except OSError:  # the launcher removed its directory: the job is ending
        pass


def _sample(path: str, poll_s: float, stop: threading.Event) -> None:
    me = threading.get_ident()
    # thread id -> (frame of the collective, first seen); holding the frame keeps its identity
    current: dict[int, tuple[FrameType, float]] = {}
    last: tuple[str, float] | None = None
    _write(path, None)
    while not stop.wait(poll_s):
        now = time.monotonic()
        seen: dict[int, tuple[FrameType, float]] = {}
        frame: FrameType | None = None
        top: FrameType | None = None
        for tid, top in sys._current_frames().items():
            frame = _collective(top) if tid != me else None
            if frame is not None:
                prev = current.get(tid)
                seen[tid] = prev if prev is not None and prev[0] is frame else (frame, now)
        current = seen
        state = None
        if current:
            oldest, since = min(current.values(), key=lambda v: v[1])
            state = (oldest.f_code.co_name, since)
            del oldest
        frame = top = None  # hold no frame but the collectives' own
        if state != last:
            _write(path, state)
            last = state


def _clean_path(here: str) -> None:
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != here]
    parts = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    rest = [p for p in parts if os.path.abspath(p) != here]
    if rest:
        os.environ["PYTHONPATH"] = os.pathsep.join(rest)
    else:
        os.environ.pop("PYTHONPATH", None)


def _start() -> None:
    path = os.environ.pop("DS_HEARTBEAT_FILE", None)
    poll = os.environ.pop("DS_HEARTBEAT_POLL", None)
    if not path:
        return
    stop = threading.Event()
    t = threading.Thread(
        target=_sample, args=(path, float(poll or 0.5), stop), name="ds-heartbeat", daemon=True
    )
    t.start()

    pid = os.getpid()

    def _stop() -> None:
        if os.getpid() != pid:  # a forked child exiting: the rank itself goes on
            return
        stop.set()
        t.join(timeout=2.0)
        # Registered first, so this runs after every atexit handler of the script's: what is left
        # is the interpreter's own teardown, which must not take long either (a process group
        # joining a collective that never completes would hang here).
        _write(path, (EXIT, time.monotonic()))

    atexit.register(_stop)


def _chain() -> None:
    """Run the next ``sitecustomize`` on the path, the one this module shadows, if any."""
    ours = sys.modules.pop("sitecustomize", None)
    try:
        importlib.import_module("sitecustomize")
    except ModuleNotFoundError as exc:
        if exc.name != "sitecustomize":
            raise
        if ours is not None:
            sys.modules["sitecustomize"] = ours


_clean_path(os.path.dirname(os.path.abspath(__file__)))
_start()
_chain()
