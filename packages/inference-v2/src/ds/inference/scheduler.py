"""Continuous batching with Dynamic SplitFuse.

Each step packs one forward under a token budget: every running sequence that decodes contributes
one token, then prompts fill the rest of the budget, long prompts split into chunks across steps.
Requests join as soon as the KV cache has room and leave the moment they finish. When a decode
cannot get a KV block, the most recently admitted request is preempted: its blocks are freed and
it is recomputed later from its prompt and the tokens it already produced.

One request's failure is its own: input is checked before it joins a batch, a forward that fails
is retried one sequence at a time so that only the sequences that fail on their own end (with
``finish_reason == "error"``), and a sampling error ends only the request it came from.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch

from ds.inference.config import SchedulerConfig
from ds.inference.detokenize import IncrementalText
from ds.inference.engine import InferenceEngineV2
from ds.inference.sampling import Sampler, option, token_logprobs, top_logprobs
from ds.interfaces.errors import InferenceError
from ds.interfaces.inference import SamplingParams
from ds.interfaces.logging import get_logger

log = get_logger(__name__)

# on_token(uid, token, finished); token None: the request ended without a new token (a prompt
# scored with max_new_tokens == 0)
TokenCallback = Callable[[int, int | None, bool], None]
# on_error(uid, message): the request ended with finish_reason "error"
ErrorCallback = Callable[[int, str], None]


@dataclass(eq=False)
class Request:
    uid: int
    prompt: list[int]
    params: SamplingParams
    sampler: Sampler
    callback: TokenCallback | None = None
    generated: list[int] = field(default_factory=list)
    fed: int = 0  # tokens of prompt + generated whose KV is in the cache
    cached_prefix: int = 0  # prompt tokens served by the prefix cache or a sibling's blocks
    finish_reason: str | None = None
    preemptions: int = 0
    share_from: int | None = None  # a sibling with the same prompt (n > 1) whose blocks to share
    detok: IncrementalText | None = None
    text: str = ""  # released text (stop strings cut, incomplete characters held back)
    last_text: str = ""  # the part of ``text`` the latest token released
    # (logprob of each generated token, its top alternatives) when params.logprobs is set
    logprobs: list[tuple[float, list[tuple[int, float]]]] = field(default_factory=list)
    # (logprob, top alternatives) of prompt token i + 1 at index i when params.prompt_logprobs
    # is set (the first prompt token has nothing before it to be scored on)
    prompt_logprobs: list[tuple[float, list[tuple[int, float]]]] = field(default_factory=list)
    error: str | None = None

    @property
    def tokens(self) -> list[int]:
        return self.prompt + self.generated

    @property
    def pending(self) -> int:
        return len(self.prompt) + len(self.generated) - self.fed

    @property
    def needs_prompt_logits(self) -> bool:
        """Prompt logprobs are asked for and not all collected yet (a preemption keeps those
        already collected)."""
        k = option(self.params, "prompt_logprobs")
        return k is not None and len(self.prompt_logprobs) < len(self.prompt) - 1


class ContinuousBatchScheduler:
    """Implements :class:`ds.interfaces.inference.Scheduler` over an :class:`InferenceEngineV2`.

    ``decode`` turns token ids into text (stop strings, :attr:`Request.text`); ``eos_token_ids``
    end a request (``finish_reason == "stop"``) unless its params set ``ignore_eos``; ``on_error``
    hears of requests that fail on their own.
    """

    def __init__(
        self,
        engine: InferenceEngineV2,
        config: SchedulerConfig | None = None,
        decode: Callable[[list[int]], str] | None = None,
        eos_token_ids: Sequence[int] = (),
        on_error: ErrorCallback | None = None,
    ) -> None:
        self.engine = engine
        self.config = config or engine.config.scheduler
        self.decode = decode
        self.eos_token_ids = frozenset(eos_token_ids)
        self.on_error = on_error
        sm = engine.state.config
        self.budget = min(self.config.token_budget, sm.max_ragged_batch_size)
        self.max_seqs = min(
            self.config.max_running, sm.max_ragged_sequence_count, sm.max_tracked_sequences
        )
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.finished: dict[int, Request] = {}
        self.failed: dict[int, Request] = {}
        self._live: dict[int, Request] = {}
        self.forwards = 0
        self.preemptions = 0
        self.prefix_hit_tokens = 0
        self.prompt_tokens = 0

    # -- Scheduler protocol -------------------------------------------------------------------
    def add_request(
        self,
        uid: int,
        prompt: Sequence[int],
        params: SamplingParams,
        callback: TokenCallback | None = None,
        share_from: int | None = None,
    ) -> None:
        """Queue a request after checking everything about it that can be checked alone; a
        refusal raises (InferenceError / ConfigError) and leaves the scheduler unchanged."""
        if not prompt:
            raise InferenceError(f"request {uid} has an empty prompt")
        if uid in self._live or uid in self.finished or uid in self.failed:
            raise InferenceError(f"request uid {uid} is already in use")
        vocab = self.engine.model.vocab_size
        bad = [
            t for t in prompt if isinstance(t, bool) or not isinstance(t, int) or not 0 <= t < vocab
        ]
        if bad:
            raise InferenceError(
                f"request {uid}: prompt token ids must be integers in [0, {vocab}); got {bad[:5]}"
            )
        bad_bias = [t for t, _ in option(params, "logit_bias") if not 0 <= t < vocab]
        if bad_bias:
            raise InferenceError(
                f"request {uid}: logit_bias token ids must be in [0, {vocab}); got {bad_bias[:5]}"
            )
        cap = self.engine.capacity()
        limit = self.engine.max_context
        total = len(prompt) + params.max_new_tokens
        if total > limit:
            raise InferenceError(
                f"request {uid}: prompt ({len(prompt)}) + max_new_tokens ({params.max_new_tokens}) "
                f"exceeds the model's context of {limit} tokens (max_context)"
            )
        if -(-total // cap.block_size) > cap.total_blocks:
            raise InferenceError(
                f"request {uid} needs up to {total} tokens of KV cache but the whole cache holds "
                f"{cap.total_blocks * cap.block_size}; enlarge kv_cache.num_blocks"
            )
        req = Request(uid, list(prompt), params, Sampler(params), callback, share_from=share_from)
        if self.decode is not None:
            req.detok = IncrementalText(self.decode, params.stop_strings)
        self.waiting.append(req)
        self._live[uid] = req

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def request(self, uid: int) -> Request | None:
        """A live, finished or failed request by uid."""
        return self._live.get(uid) or self.finished.get(uid) or self.failed.get(uid)

    def abort(self, uid: int) -> bool:
        """Drop a waiting or running request and free its blocks; False if it is not live."""
        req = self._live.pop(uid, None)
        if req is None:
            return False
        self._remove(req)
        req.finish_reason = "abort"
        return True

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
                # Cannot happen for requests add_request accepted; if it does, end the oldest
                # request instead of spinning on it forever.
                victim = self.running[0] if self.running else self.waiting[0]
                self._fail(
                    victim,
                    "no request can be scheduled: the KV cache is too small for the next prompt "
                    "chunk; enlarge kv_cache.num_blocks or lower scheduler.token_budget",
                )
            return {}
        rows, full = self._forward(plan)
        self.forwards += 1
        greedy = _greedy_tokens(plan, rows)
        out: dict[int, list[int]] = {}
        for (req, n), logits, chunk_logits in zip(plan, rows, full):
            if logits is None:
                continue  # failed alone in _forward
            if chunk_logits is not None and not self._collect_prompt_logprobs(req, chunk_logits):
                continue
            req.fed += n
            if req.pending:
                continue  # mid-prompt chunk: its logits are not needed
            if req.params.max_new_tokens == 0:  # prompt scoring: nothing to generate
                req.finish_reason = "length"
                if req.callback is not None:
                    req.callback(req.uid, None, True)
                continue
            try:
                token = greedy.get(req.uid)
                if token is None:
                    token = req.sampler(logits, req.tokens, req.generated)
                k = option(req.params, "logprobs")
                if k is not None:
                    req.logprobs.append(top_logprobs(logits, token, k))
            except Exception as exc:  # a sampling error (grammar, numerics) ends this request
                self._fail(req, f"sampling failed: {exc}")
                continue
            req.generated.append(token)
            out[req.uid] = [token]
            self._check_finished(req)
            if req.callback is not None and req.finish_reason is None:
                req.callback(req.uid, token, False)
        for req in [r for r in self.running if r.finish_reason is not None]:
            self.running.remove(req)
            self.engine.flush(req.uid)
            self._live.pop(req.uid, None)
            self.finished[req.uid] = req
            # Told after the flush: when a client hears its request ended, its blocks are free.
            if req.callback is not None and req.uid in out:
                req.callback(req.uid, out[req.uid][-1], True)
        return out

    # -- internals ----------------------------------------------------------------------------
    def _forward(
        self, plan: list[tuple[Request, int]]
    ) -> tuple[list[torch.Tensor | None], list[torch.Tensor | None]]:
        """Last-token logits per planned request (None for a request that failed), and the
        logits of every chunk token for requests that collect prompt logprobs.

        A failed batched forward is retried one sequence at a time, so the sequence that caused
        it fails alone and the others get their logits (the ragged batch makes each sequence's
        result independent of its neighbours).
        """
        uids = [r.uid for r, _ in plan]
        chunks = [r.tokens[r.fed : r.fed + n] for r, n in plan]
        flags = [r.needs_prompt_logits for r, _ in plan]
        try:
            logits, full = self.engine.put_logits(uids, chunks, flags)
            return [logits[i] for i in range(len(plan))], full
        except Exception as exc:
            if len(plan) == 1:
                self._fail(plan[0][0], str(exc))
                return [None], [None]
            log.warning("batched forward failed; retrying one sequence at a time", error=str(exc))
        rows: list[torch.Tensor | None] = []
        fulls: list[torch.Tensor | None] = []
        for (req, _), uid, chunk, flag in zip(plan, uids, chunks, flags):
            try:
                logits, full = self.engine.put_logits([uid], [chunk], [flag])
                rows.append(logits[0])
                fulls.append(full[0])
            except Exception as exc:
                self._fail(req, str(exc))
                rows.append(None)
                fulls.append(None)
        return rows, fulls

    def _collect_prompt_logprobs(self, req: Request, chunk_logits: torch.Tensor) -> bool:
        """Score the prompt tokens this chunk's logits predict (row j predicts the token after
        position ``req.fed + j``); positions scored before a preemption are skipped. False when
        scoring failed and the request ended."""
        first = len(req.prompt_logprobs) - req.fed  # the row predicting the next unscored token
        stop = min(chunk_logits.shape[0], len(req.prompt) - 1 - req.fed)
        if first < 0 or first >= stop:
            return True
        start = req.fed + first + 1
        targets = req.prompt[start : start + stop - first]
        try:
            k = option(req.params, "prompt_logprobs")
            req.prompt_logprobs.extend(token_logprobs(chunk_logits[first:stop], targets, k))
        except Exception as exc:  # numerics of this request's logits: it ends alone
            self._fail(req, f"prompt logprobs failed: {exc}")
            return False
        return True

    def _fail(self, req: Request, message: str) -> None:
        log.warning("request failed", uid=req.uid, error=message)
        self._live.pop(req.uid, None)
        self._remove(req)
        req.finish_reason = "error"
        req.error = message
        self.failed[req.uid] = req
        if self.on_error is not None:
            self.on_error(req.uid, message)

    def _remove(self, req: Request) -> None:
        if req in self.waiting:
            self.waiting.remove(req)
        if req in self.running:
            self.running.remove(req)
        if req.uid in self.engine.state:
            self.engine.flush(req.uid)

    def _admit(self) -> None:
        for req in list(self.waiting):
            if len(self.running) >= self.max_seqs:
                return
            parent = self._live.get(req.share_from) if req.share_from is not None else None
            waits = parent is not None and req.fed == 0 and parent.fed < len(parent.prompt)
            if waits and not req.needs_prompt_logits:
                continue  # wait for the sibling's prompt to be cached, then share its blocks
            first = min(req.pending, self.budget) if self.config.chunked_prefill else req.pending
            need = -(-min(first, self.budget) // self.engine.block_size)
            if self.engine.capacity().free_blocks < need and self.running:
                return  # back-pressure: wait for running requests to finish
            self.waiting.remove(req)
            if req.fed == 0:
                hit = 0
                # Cached blocks hold KV, not logits: a prompt served from them would leave its
                # tokens unscored. A request collecting prompt logprobs computes its whole prompt
                # (recomputing a hit costs the same as not taking it, and needs no second path);
                # its blocks still go into the prefix cache for others.
                reuse = not req.needs_prompt_logits
                if reuse and parent is not None and parent.uid in self.engine.state:
                    hit = self.engine.share_prefix(parent.uid, req.uid, req.prompt)
                if reuse and not hit and self.engine.config.prefix_caching:
                    hit = self.engine.match_prefix(req.uid, req.tokens)
                req.fed = hit
                if not req.preemptions:
                    req.cached_prefix = hit
                    self.prefix_hit_tokens += hit
                    self.prompt_tokens += len(req.prompt)
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
        self.preemptions += 1
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
                        self._fail(
                            req,
                            f"request {req.uid}: prompt of {want} tokens exceeds "
                            "state_manager.max_ragged_batch_size with chunked_prefill off; "
                            "enable scheduler.chunked_prefill or raise max_ragged_batch_size",
                        )
                        continue
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
        piece = ""
        if token in p.stop_token_ids or (
            token in self.eos_token_ids and not option(p, "ignore_eos")
        ):
            req.finish_reason = "stop"  # the stop token's own text is not part of the output
        elif req.detok is not None:
            piece = req.detok.push(token)
            if req.detok.stopped:
                req.finish_reason = "stop"
        if req.finish_reason is None and req.sampler.grammar_done:
            req.finish_reason = "stop"
        if req.finish_reason is None and len(req.generated) >= p.max_new_tokens:
            req.finish_reason = "length"
        if req.finish_reason is not None and req.detok is not None:
            piece += req.detok.finish()
        req.text += piece
        req.last_text = piece


def _greedy_tokens(
    plan: list[tuple[Request, int]], rows: list[torch.Tensor | None]
) -> dict[int, int]:
    """The tokens of the plain-greedy requests that sample this step, read from the device in
    one transfer: the argmax of each row (as the sampler takes it), stacked."""
    picked = [
        (req.uid, logits)
        for (req, n), logits in zip(plan, rows)
        if logits is not None
        and req.fed + n >= len(req.tokens)  # the chunk ends the known tokens: it samples
        and req.sampler.plain_greedy
    ]
    if len(picked) < 2:
        return {}
    # max(dim).indices, not argmax: the same first index of the largest value (NaN counts as
    # largest in both), about 3x faster over a vocabulary-wide row on CPU.
    tokens = torch.stack([row for _, row in picked]).max(dim=-1).indices.tolist()
    return {uid: int(t) for (uid, _), t in zip(picked, tokens)}
