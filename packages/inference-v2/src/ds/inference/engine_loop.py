"""The engine thread of ``ds serve``: everything touching the engine happens here.

HTTP handlers submit validated requests through a queue and receive events through a callback;
between two forwards the thread drains the queue, so an abort lands within one engine step. A
request that fails ends alone (the scheduler isolates it); a step that fails for a reason the
scheduler could not pin on one request fails the requests in flight, and the thread goes on. If
the thread itself dies, :attr:`EngineLoop.dead` says why, every waiting request gets a 500, and
``on_death`` is called so the process can exit non-zero.
"""

from __future__ import annotations

import contextlib
import itertools
import queue
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from ds.inference.engine import InferenceEngineV2
from ds.inference.sampling import option
from ds.inference.scheduler import ContinuousBatchScheduler
from ds.inference.tokenizer import TextCodec
from ds.interfaces.errors import DsError
from ds.interfaces.inference import SamplingParams
from ds.interfaces.logging import get_logger

log = get_logger(__name__)


LogProb = tuple[float, list[tuple[int, float]]]


@dataclass(frozen=True)
class TokenEvent:
    token: int | None  # None: the request ended without a new token (max_tokens 0)
    text: str  # text this token released (stop strings and partial characters held back)
    finish_reason: str | None
    logprob: LogProb | None = None
    prompt_tokens: int = 0
    cached_tokens: int = 0
    # On a request's first event when prompt logprobs were asked for: prompt tokens 1.. scored
    prompt_logprobs: list[LogProb] | None = None


@dataclass(frozen=True)
class ErrorEvent:
    status: int
    message: str


Event = TokenEvent | ErrorEvent
Deliver = Callable[[Event], None]


@dataclass
class _Submission:
    uids: list[int]
    prompt: list[int]
    params: list[SamplingParams]
    deliver: list[Deliver]


@dataclass
class _Live:
    deliver: Deliver
    arrived: float
    last: float | None = None
    admitted: float | None = None  # first scheduled (the start of the step that took it)
    first: float | None = None  # first token


class EngineLoop:
    def __init__(
        self,
        engine: InferenceEngineV2,
        codec: TextCodec,
        metrics: Any = None,
        on_death: Callable[[], None] | None = None,
    ) -> None:
        self.engine = engine
        self.codec = codec
        self.metrics = metrics
        self.on_death = on_death
        self.scheduler = ContinuousBatchScheduler(
            engine,
            decode=codec.decode if codec.available else None,
            eos_token_ids=engine.eos_token_ids,
            on_error=self._on_error,
        )
        self.dead: str | None = None
        self._inbox: queue.Queue[_Submission | int | None] = queue.Queue()
        self._uids = itertools.count()
        self._live: dict[int, _Live] = {}
        self._forwards_seen = self._prompt_seen = self._hits_seen = self._preempted_seen = 0
        self._step_started = time.monotonic()
        self._update_gauges()
        self._thread = threading.Thread(target=self._run, name="ds-serve-engine", daemon=True)
        self._thread.start()

    # -- called from HTTP handlers ------------------------------------------------------------
    def submit(
        self, prompt: list[int], params: Sequence[SamplingParams], deliver: Sequence[Deliver]
    ) -> list[int]:
        """Queue one prompt with one sequence per params (``n`` choices share the prompt's KV
        blocks); returns the sequences' uids."""
        uids = [next(self._uids) for _ in params]
        if self.dead is not None:
            for d in deliver:
                d(ErrorEvent(503, f"the engine is not running: {self.dead}"))
            return uids
        self._inbox.put(_Submission(uids, prompt, list(params), list(deliver)))
        return uids

    def abort(self, uid: int) -> None:
        """Stop a request whose client went away (applied before the next engine step)."""
        self._inbox.put(uid)

    def close(self, timeout: float = 10.0) -> None:
        self._inbox.put(None)
        self._thread.join(timeout=timeout)

    @property
    def alive(self) -> bool:
        return self.dead is None and self._thread.is_alive()

    # -- engine thread ------------------------------------------------------------------------
    def _send(self, uid: int, event: Event) -> None:
        live = self._live.get(uid)
        if live is None:
            return
        if isinstance(event, ErrorEvent) or event.finish_reason is not None:
            del self._live[uid]
        try:
            live.deliver(event)
        except Exception as exc:  # the handler's event loop is gone (shutdown): drop it
            log.debug("could not deliver an event", uid=uid, error=repr(exc))

    def _accept(self, sub: _Submission) -> None:
        now = time.monotonic()
        first = sub.uids[0]
        added: list[int] = []
        try:
            for uid, params in zip(sub.uids, sub.params):
                share = first if uid != first else None
                self.scheduler.add_request(uid, sub.prompt, params, self._on_token, share)
                added.append(uid)
        except DsError as exc:
            for uid in added:
                self.scheduler.abort(uid)
            for d in sub.deliver:
                with contextlib.suppress(Exception):  # a handler that is gone
                    d(ErrorEvent(400, str(exc)))
            return
        for uid, d in zip(sub.uids, sub.deliver):
            self._live[uid] = _Live(d, now)

    def _on_token(self, uid: int, token: int | None, finished: bool) -> None:
        req = self.scheduler.request(uid)
        live = self._live.get(uid)
        if req is None or live is None:
            return
        now = time.monotonic()
        if live.admitted is None:
            live.admitted = self._step_started
        if live.first is None:
            live.first = now
        if self.metrics is not None:
            if live.last is None:
                self.metrics.ttft.observe(now - live.arrived)
            else:
                self.metrics.tpot.observe(now - live.last)
            if token is not None:
                self.metrics.generation_tokens.inc()
            if finished and req.finish_reason:
                self._observe_finish(live, req.finish_reason, now)
        first = live.last is None
        live.last = now
        scored = None
        if first and option(req.params, "prompt_logprobs") is not None:
            scored = list(req.prompt_logprobs)
        event = TokenEvent(
            token,
            req.last_text if token is not None else "",
            req.finish_reason if finished else None,
            req.logprobs[-1] if req.logprobs and token is not None else None,
            len(req.prompt),
            req.cached_prefix,
            scored,
        )
        self._send(uid, event)

    def _observe_finish(self, live: _Live, reason: str, now: float) -> None:
        m = self.metrics
        m.finished(reason)
        m.e2e.observe(now - live.arrived)
        admitted = live.admitted if live.admitted is not None else now
        first = live.first if live.first is not None else now
        m.queue_time.observe(admitted - live.arrived)
        m.prefill_time.observe(first - admitted)
        m.decode_time.observe(now - first)

    def _on_error(self, uid: int, message: str) -> None:
        if self.metrics is not None:
            self.metrics.finished("error")
        self._send(uid, ErrorEvent(400, message))

    def _drain_inbox(self, block: bool) -> bool:
        """Apply submissions and aborts; False when asked to stop."""
        try:
            while True:
                item = self._inbox.get(block=block)
                block = False
                if item is None:
                    return False
                if isinstance(item, int):
                    if self.scheduler.abort(item) and self.metrics is not None:
                        self.metrics.finished("abort")
                    self._live.pop(item, None)
                else:
                    self._accept(item)
        except queue.Empty:
            return True

    def _iteration(self) -> bool:
        if not self._drain_inbox(block=not self.scheduler.has_unfinished()):
            return False
        if self.scheduler.has_unfinished():
            self._step_started = time.monotonic()
            try:
                self.scheduler.step()
            except Exception as exc:  # not pinned on one request: fail those in flight
                log.error("engine step failed", error=repr(exc))
                self._fail_in_flight(500, f"engine step failed: {exc}")
            for req in self.scheduler.running:  # admitted by this step, no token yet
                live = self._live.get(req.uid)
                if live is not None and live.admitted is None:
                    live.admitted = self._step_started
            self.scheduler.finished.clear()  # results went out through the callbacks
            self.scheduler.failed.clear()
        self._update_gauges()
        return True

    def _fail_in_flight(self, status: int, message: str) -> None:
        for uid in list(self._live):
            self.scheduler.abort(uid)
            self._send(uid, ErrorEvent(status, message))

    def _update_gauges(self) -> None:
        m = self.metrics
        if m is None:
            return
        cap = self.engine.capacity()
        s = self.scheduler
        m.running.set(len(s.running))
        m.waiting.set(len(s.waiting))
        m.kv_free.set(cap.free_blocks)
        m.kv_used.set(cap.total_blocks - cap.free_blocks)
        m.kv_usage.set((cap.total_blocks - cap.free_blocks) / cap.total_blocks)
        m.forwards.inc(s.forwards - self._forwards_seen)
        self._forwards_seen = s.forwards
        m.preemptions.inc(s.preemptions - self._preempted_seen)
        self._preempted_seen = s.preemptions
        prompt, hits = s.prompt_tokens, s.prefix_hit_tokens
        m.prompt_tokens.inc(prompt - self._prompt_seen)
        m.prefix_hit_tokens.inc(hits - self._hits_seen)
        self._prompt_seen, self._hits_seen = prompt, hits
        m.prefix_hit_rate.set(hits / prompt if prompt else 0.0)

    def _run(self) -> None:
        try:
            while self._iteration():
                pass
            self._fail_in_flight(503, "the server is shutting down")
        except BaseException as exc:
            self.dead = repr(exc)
            log.error("the engine thread died", error=self.dead)
            message = f"the engine stopped: {self.dead}"
            try:
                for uid in list(self._live):
                    self._send(uid, ErrorEvent(500, message))
                while True:  # submissions that arrived too late
                    item = self._inbox.get_nowait()
                    if isinstance(item, _Submission):
                        for d in item.deliver:
                            d(ErrorEvent(503, message))
            except Exception:
                pass  # queue.Empty, or a handler that is gone
            finally:
                if self.on_death is not None:
                    self.on_death()
