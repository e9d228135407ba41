"""Hang defence: bounded waits on collectives and an error that says who is missing.

When enabled, every collective issued through ds.comm is numbered per process group and waited on
with a timeout instead of forever. A daemon thread publishes this rank's latest collective number
to the job's key-value store (the one torch.distributed already rendezvoused through) every
``poll_s`` seconds; keeping store traffic off the call path keeps the per-call cost to a counter
increment. When a wait runs out, the rank reads every peer's published position and raises::

    CollectiveTimeoutError: rank 0 waited 5.0 s in all_reduce(#12, 4 MiB) on group world
    (ranks 0..2); ranks missing: 2 (last entered #11 broadcast)

The thread also logs a warning once a collective has been in flight for ``warn_after_s``.
"""

from __future__ import annotations

import atexit
import contextlib
import threading
import time
import weakref
from dataclasses import dataclass, field
from typing import Any

import torch.distributed as _dist

from ds.comm._format import fmt_bytes
from ds.comm._groups import global_rank, group_key, group_label, group_ranks
from ds.interfaces.errors import CollectiveTimeoutError, CommError
from ds.interfaces.logging import get_logger

log = get_logger(__name__)

_PREFIX = "ds_comm/watchdog"


@dataclass(eq=False)
class Token:
    """One in-flight collective as the watchdog sees it."""

    key: str
    seq: int
    name: str
    nbytes: int
    group: Any
    t0: float
    warned: bool = field(default=False)


def describe_missing(seq: int, name: str, positions: dict[int, tuple[int, str] | None]) -> str:
    """The "ranks missing" part of the timeout message, from each peer's last (seq, op)."""
    missing = []
    for r, pos in sorted(positions.items()):
        if pos is None:
            missing.append(f"{r} (position unknown: store unreachable)")
        elif pos[0] < seq:
            last = f"#{pos[0]} {pos[1]}" if pos[0] else "none"
            missing.append(f"{r} (last entered {last})")
        elif pos[0] > seq:
            missing.append(f"{r} (already at #{pos[0]} {pos[1]})")
        elif pos[1] != name:
            missing.append(f"{r} (in {pos[1]} #{pos[0]} instead)")
    return ", ".join(missing) if missing else "none found (every rank entered it; a peer died?)"


def _default_store() -> Any:
    try:
        return _dist.distributed_c10d._get_default_store()
    except Exception:  # no store (e.g. a backend initialised without one): positions unknown
        return None


class Watchdog:
    """Per-rank watchdog; see the module docstring. Create after the process group exists."""

    def __init__(
        self,
        timeout_s: float = 300.0,
        poll_s: float = 0.5,
        warn_after_s: float | None = None,
        store: Any = None,
    ) -> None:
        if not timeout_s > 0:  # also refuses NaN, which would never time out
            raise CommError(f"watchdog timeout_s must be > 0 seconds, got {timeout_s}")
        if not _dist.is_initialized():
            raise CommError(
                "the watchdog needs an initialised process group; call "
                "ds.comm.init_distributed() before enabling it"
            )
        self.timeout_s = float(timeout_s)
        self.poll_s = float(poll_s)
        self.warn_after_s = float(warn_after_s) if warn_after_s is not None else timeout_s / 2
        self._store = store if store is not None else _default_store()
        self._rank = global_rank()
        self._positions: dict[str, tuple[int, str]] = {}
        self._published: dict[str, int] = {}
        self._inflight: dict[int, Token] = {}
        self._publish_lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="ds-comm-watchdog", daemon=True)
        self._thread.start()
        # Python 3.11 ends a daemon thread that wants the GIL back during interpreter shutdown with
        # pthread_exit; if that thread is inside a store call (C++ that released the GIL), the
        # forced unwind aborts the process ("terminate called without an active exception") after
        # the job has finished. Stopping the thread while the interpreter is still whole avoids it.
        atexit.register(_stop_at_exit, weakref.ref(self))

    # -- call path (main thread): dictionary updates only ----------------------------------------
    def enter(self, name: str, nbytes: int, group: Any) -> Token:
        key = group_key(group)
        pos = self._positions.get(key)
        seq = (pos[0] if pos is not None else 0) + 1
        self._positions[key] = (seq, name)
        token = Token(key, seq, name, nbytes, group, time.perf_counter())
        self._inflight[id(token)] = token
        return token

    def leave(self, token: Token) -> None:
        self._inflight.pop(id(token), None)

    # -- background thread ------------------------------------------------------------------------
    def _loop(self) -> None:
        while not self._stop.wait(self.poll_s):
            if not _dist.is_initialized():
                return  # the group was destroyed (perhaps by torch directly): nothing to watch
            try:
                self._publish()
                self._warn_slow()
            except Exception as exc:  # a dead store must not kill the training process
                log.debug("watchdog heartbeat failed", error=str(exc))

    def _publish(self) -> None:
        store = self._store
        if store is None:
            return
        with self._publish_lock:
            for key, (seq, name) in list(self._positions.items()):
                if self._published.get(key) != seq:
                    store.set(f"{_PREFIX}/{key}/{self._rank}", f"{seq}:{name}")
                    self._published[key] = seq

    def _warn_slow(self) -> None:
        now = time.perf_counter()
        for token in list(self._inflight.values()):
            if not token.warned and now - token.t0 > self.warn_after_s:
                token.warned = True
                log.warning(
                    "collective is taking long",
                    rank=self._rank,
                    op=token.name,
                    seq=token.seq,
                    size=fmt_bytes(token.nbytes),
                    waited_s=round(now - token.t0, 1),
                )

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout=2 * self.poll_s + 1)

    # -- on timeout -------------------------------------------------------------------------------
    def peer_positions(self, token: Token) -> dict[int, tuple[int, str] | None]:
        """Latest (seq, op) each member of the token's group published (None: unreadable)."""
        out: dict[int, tuple[int, str] | None] = {}
        store = self._store
        for r in group_ranks(token.group):
            if r == self._rank:
                continue
            if store is None:
                out[r] = None
                continue
            key = f"{_PREFIX}/{token.key}/{r}"
            try:
                if not store.check([key]):
                    out[r] = (0, "")
                    continue
                seq_s, _, op = store.get(key).decode().partition(":")
                out[r] = (int(seq_s), op)
            except Exception:
                out[r] = None
        return out

    def timeout_error(
        self, token: Token, waited_s: float, cause: BaseException | None = None
    ) -> CollectiveTimeoutError:
        with contextlib.suppress(Exception):
            self._publish()
        # Give the peers' heartbeat threads one more round to publish where they are.
        time.sleep(2 * self.poll_s)
        who = describe_missing(token.seq, token.name, self.peer_positions(token))
        detail = f" [{cause}]" if cause is not None else ""
        return CollectiveTimeoutError(
            f"rank {self._rank} waited {waited_s:.1f} s in {token.name}(#{token.seq}, "
            f"{fmt_bytes(token.nbytes)}) on group {group_label(token.group)}; ranks missing: "
            f"{who}. Check that every rank of the group issues the same collectives in the same "
            f"order, or raise the timeout (watchdog timeout_s={self.timeout_s:g}).{detail}"
        )


def _stop_at_exit(ref: weakref.ref[Watchdog]) -> None:
    wd = ref()
    if wd is not None:
        wd.stop()
