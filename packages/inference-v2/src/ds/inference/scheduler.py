"""Continuous batching with Dynamic SplitFuse.

Each step packs one forward under a token budget: every running sequence that decodes contributes
one token, then prompts fill the rest of the budget, long prompts split into chunks across steps.
Requests join as soon as the KV cache has room and leave the moment they finish. When a decode
cannot get a KV block, the most recently admitted request is preempted: its blocks are freed and
it is recomputed later from its prompt and the tokens it already produced.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from ds.inference.config import SchedulerConfig
from ds.inference.engine import InferenceEngineV2
from ds.inference.sampling import Sampler
from ds.interfaces.errors import InferenceError
from ds.interfaces.inference import SamplingParams
from ds.interfaces.logging import get_logger

log = get_logger(__name__)

# on_token(uid, token, finished)
TokenCallback = Callable[[int, int, bool], None]


@dataclass
class Request:
    uid: int
    prompt: list[int]
    params: SamplingParams
    sampler: Sampler
    callback: TokenCallback | None = None
    generated: list[int] = field(default_factory=list)
    fed: int = 0  # tokens of prompt + generated whose KV is in the cache
    cached_prefix: int = 0  # prompt tokens served by the prefix cache
    finish_reason: str | None = None
    preemptions: int = 0

    @property
    def tokens(self) -> list[int]:
        return self.prompt + self.generated

    @property
    def pending(self) -> int:
        return len(self.prompt) + len(self.generated) - self.fed


class ContinuousBatchScheduler:
    """Implements :class:`ds.interfaces.inference.Scheduler` over an :class:`InferenceEngineV2`."""

    def __init__(
        self,
        engine: InferenceEngineV2,
        config: SchedulerConfig | None = None,
        decode: Callable[[list[int]], str] | None = None,
    ) -> None:
        self.engine = engine
        self.config = config or engine.config.scheduler
        self.decode = decode
        sm = engine.state.config
        self.budget = min(self.config.token_budget, sm.max_ragged_batch_size)
        self.max_seqs = min(
            self.config.max_running, sm.max_ragged_sequence_count, sm.max_tracked_sequences
        )
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.finished: dict[int, Request] = {}
        self.forwards = 0
        self.prefix_hit_tokens = 0

    # -- Scheduler protocol -------------------------------------------------------------------
    def add_request(
        self,
        uid: int,
        prompt: Sequence[int],
        params: SamplingParams,
        callback: TokenCallback | None = None,
    ) -> None:
        if not prompt:
            raise InferenceError(f"request {uid} has an empty prompt")
        if any(r.uid == uid for r in (*self.waiting, *self.running)) or uid in self.finished:
            raise InferenceError(f"request uid {uid} is already in use")
        cap = self.engine.capacity()
        limit = self.engine.state.config.max_context
        total = len(prompt) + params.max_new_tokens
        if total > limit:
            raise InferenceError(
                f"request {uid}: prompt ({len(prompt)}) + max_new_tokens ({params.max_new_tokens}) "
                f"exceeds state_manager.max_context={limit}"
            )
        if -(-total // cap.block_size) > cap.total_blocks:
            raise InferenceError(
                f"request {uid} needs up to {total} tokens of KV cache but the whole cache holds "
                f"{cap.total_blocks * cap.block_size}; enlarge kv_cache.num_blocks"
            )
        self.waiting.append(Request(uid, list(prompt), params, Sampler(params), callback))

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def abort(self, uid: int) -> bool:
        """Drop a waiting or running request and free its blocks; False if it is not live."""
        for pool in (self.waiting, self.running):
            for req in pool:
                if req.uid == uid:
                    pool.remove(req)
                    if uid in self.engine.state:
                        self.engine.flush(uid)
                    return True
        return False

    def step(self) -> dict[int, list[int]]:
        self._admit()
        self._make_room_for_decodes()
        plan = self._plan()
        while not plan and len(self.running) > 1:
            # Partly prefilled prompts hold the whole cache: free the newest and retry.
            self._preempt()
            plan = self._plan()
        if not plan:
            if self.running or self.waiting:
                raise InferenceError(
                    "no request can be scheduled: the KV cache is too small for the next prompt "
                    "chunk; enlarge kv_cache.num_blocks or lower scheduler.token_budget"
                )
            return {}
        uids = [r.uid for r, _ in plan]
        chunks = [r.tokens[r.fed : r.fed + n] for r, n in plan]
        logits = self.engine.put(uids, chunks)
        self.forwards += 1
        out: dict[int, list[int]] = {}
        for row, (req, n) in enumerate(plan):
            req.fed += n
            if req.pending:
                continue  # mid-prompt chunk: its logits are not needed
            token = req.sampler(logits[row], req.tokens)
            req.generated.append(token)
            out[req.uid] = [token]
            self._check_finished(req)
            if req.callback is not None:
                req.callback(req.uid, token, req.finish_reason is not None)
        for req in [r for r in self.running if r.finish_reason is not None]:
            self.running.remove(req)
            self.engine.flush(req.uid)
            self.finished[req.uid] = req
        return out

    # -- internals ----------------------------------------------------------------------------
    def _admit(self) -> None:
        while self.waiting and len(self.running) < self.max_seqs:
            req = self.waiting[0]
            first = min(req.pending, self.budget) if self.config.chunked_prefill else req.pending
            need = -(-min(first, self.budget) // self.engine.block_size)
            if self.engine.capacity().free_blocks < need and self.running:
                return  # back-pressure: wait for running requests to finish
            self.waiting.popleft()
            if self.engine.config.prefix_caching and req.fed == 0:
                hit = self.engine.match_prefix(req.uid, req.tokens)
                req.fed = hit
                req.cached_prefix = hit
                self.prefix_hit_tokens += hit
            self.running.append(req)

    def _make_room_for_decodes(self) -> None:
        while True:
            need = sum(self.engine.query(r.uid, 1, 1)[1] for r in self.running if r.pending == 1)
            if need <= self.engine.capacity().free_blocks or len(self.running) <= 1:
                return
            self._preempt()

    def _preempt(self) -> None:
        """Free the most recently admitted request; it is recomputed when readmitted."""
        victim = self.running.pop()
        log.debug("preempting request", uid=victim.uid, generated=len(victim.generated))
        if victim.uid in self.engine.state:
            self.engine.flush(victim.uid)
        victim.fed = 0
        victim.preemptions += 1
        self.waiting.appendleft(victim)

    def _plan(self) -> list[tuple[Request, int]]:
        """Decodes then prompt chunks under the token budget (SplitFuse). Without chunking,
        whole prompts go first so that a steady stream of decodes cannot starve them."""
        chunked = self.config.chunked_prefill
        limit = self.engine.state.config.max_ragged_batch_size
        budget = self.budget
        free = self.engine.capacity().free_blocks
        plan: list[tuple[Request, int]] = []
        decodes = [r for r in self.running if r.pending == 1]
        prompts = [r for r in self.running if r.pending > 1]
        order = decodes + prompts if chunked else prompts + decodes
        used = 0
        for req in order:
            if len(plan) >= self.max_seqs:
                break
            if chunked:
                want = min(req.pending, budget - used)
            else:
                want = req.pending
                if used + want > (limit if req.pending > 1 else budget):
                    if plan:
                        continue
                    if want > limit:
                        raise InferenceError(
                            f"request {req.uid}: prompt of {want} tokens exceeds "
                            "state_manager.max_ragged_batch_size with chunked_prefill off; "
                            "enable scheduler.chunked_prefill or raise max_ragged_batch_size"
                        )
            if want <= 0:
                break
            n, blocks = self.engine.query(req.uid, want, free)
            if n < want and (not chunked or n == 0):
                continue
            plan.append((req, n))
            used += n
            free -= blocks
        return plan

    def _check_finished(self, req: Request) -> None:
        p = req.params
        token = req.generated[-1]
        if token in p.stop_token_ids:
            req.finish_reason = "stop"
        elif p.stop_strings and self.decode is not None:
            text = self.decode(req.generated)
            if any(s in text for s in p.stop_strings):
                req.finish_reason = "stop"
        if req.finish_reason is None and len(req.generated) >= p.max_new_tokens:
            req.finish_reason = "length"
