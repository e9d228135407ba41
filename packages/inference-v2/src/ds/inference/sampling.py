"""Token sampling: greedy, temperature, top-k, top-p, min-p, repetition / presence / frequency
penalties, logit bias, per-request seeds, and an optional grammar mask.

:class:`SamplingOptions` extends the interface's :class:`SamplingParams` with the OpenAI-style
knobs the server accepts; code that only knows ``SamplingParams`` keeps working because every
extra field has a neutral default.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from ds.interfaces.errors import ConfigError
from ds.interfaces.inference import SamplingParams

# torch.Generator.manual_seed takes values in [-2**63, 2**64); larger or negative JSON integers
# are folded into that range so that any integer is a valid, reproducible seed.
_SEED_RANGE = 2**64


@dataclass(frozen=True)
class SamplingOptions(SamplingParams):
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    min_p: float = 0.0
    logit_bias: tuple[tuple[int, float], ...] = ()
    ignore_eos: bool = False
    logprobs: int | None = None  # None: no logprobs; k >= 0: the sampled token's plus top k
    # None: none; k >= 0: each prompt token's logprob (from the second on) plus the top k there.
    # With it set, max_new_tokens may be 0: score the prompt, generate nothing.
    prompt_logprobs: int | None = None
    # A compiled grammar (ds.inference.grammar.CompiledGrammar) constraining the output.
    grammar: Any = None


def option(params: SamplingParams, name: str) -> Any:
    """A :class:`SamplingOptions` field of any params object (its default when absent)."""
    return getattr(params, name, SamplingOptions.__dataclass_fields__[name].default)


def fold_seed(seed: int) -> int:
    return seed % _SEED_RANGE


def validate(params: SamplingParams) -> None:
    problems = []
    least = 0 if option(params, "prompt_logprobs") is not None else 1
    if not isinstance(params.max_new_tokens, int) or params.max_new_tokens < least:
        problems.append(
            f"max_new_tokens={params.max_new_tokens!r} (must be an integer >= {least}; 0 only "
            "with prompt_logprobs)"
        )
    # Written as "not (ok)" so NaN, which fails every comparison, is refused too; infinity is
    # refused where it would divide the logits into NaN or zero.
    if not (0 <= params.temperature < math.inf):
        problems.append(f"temperature={params.temperature} (must be finite and >= 0; 0 is greedy)")
    if params.top_k < 0:
        problems.append(f"top_k={params.top_k} (must be >= 0; 0 disables)")
    if not 0 < params.top_p <= 1:
        problems.append(f"top_p={params.top_p} (must be in (0, 1])")
    if not (0 < params.repetition_penalty < math.inf):
        problems.append(
            f"repetition_penalty={params.repetition_penalty} (must be finite and > 0; 1 disables)"
        )
    if params.seed is not None and (
        isinstance(params.seed, bool) or not isinstance(params.seed, int)
    ):
        problems.append(f"seed={params.seed!r} (must be an integer)")
    for name in ("presence_penalty", "frequency_penalty"):
        value = option(params, name)
        if not (-2 <= value <= 2):
            problems.append(f"{name}={value} (must be in [-2, 2]; 0 disables)")
    min_p = option(params, "min_p")
    if not (0 <= min_p <= 1):
        problems.append(f"min_p={min_p} (must be in [0, 1]; 0 disables)")
    for token, bias in option(params, "logit_bias"):
        if not (-100 <= bias <= 100):
            problems.append(f"logit_bias[{token}]={bias} (must be in [-100, 100])")
    for name in ("logprobs", "prompt_logprobs"):
        k = option(params, name)
        if k is not None and not (0 <= k <= 20):
            problems.append(f"{name}={k} (must be in [0, 20])")
    if problems:
        raise ConfigError("invalid sampling parameters: " + "; ".join(problems))


class Sampler:
    """Samples one request's tokens; owns its random generator so seeds are per request."""

    def __init__(self, params: SamplingParams) -> None:
        validate(params)
        self.params = params
        self.presence = option(params, "presence_penalty")
        self.frequency = option(params, "frequency_penalty")
        self.min_p = option(params, "min_p")
        self.bias = option(params, "logit_bias")
        grammar = option(params, "grammar")
        self.matcher = grammar.matcher() if grammar is not None else None
        self.generator: torch.Generator | None = None
        if params.temperature > 0:
            self.generator = torch.Generator()
            if params.seed is not None:
                self.generator.manual_seed(fold_seed(params.seed))
            else:
                self.generator.seed()

    @property
    def plain_greedy(self) -> bool:
        """Argmax of the raw logits: no temperature, penalty, bias or grammar. The scheduler
        takes these tokens for a whole batch at once (one device read per step, not one per
        request)."""
        p = self.params
        return (
            p.temperature == 0
            and p.repetition_penalty == 1.0
            and not (self.presence or self.frequency or self.bias)
            and self.matcher is None
        )

    @property
    def grammar_done(self) -> bool:
        return self.matcher is not None and self.matcher.is_terminated()

    def __call__(
        self, logits: torch.Tensor, history: Sequence[int], generated: Sequence[int] = ()
    ) -> int:
        token = self._sample(self.process(logits, history, generated))
        if self.matcher is not None:
            self.matcher.accept(token)
        return token

    def process(
        self, logits: torch.Tensor, history: Sequence[int], generated: Sequence[int] = ()
    ) -> torch.Tensor:
        """Logits after penalties, bias and the grammar mask (before temperature)."""
        p = self.params
        x = logits.float().clone()
        if p.repetition_penalty != 1.0 and history:
            idx = torch.tensor(sorted(set(history)), dtype=torch.long, device=x.device)
            seen = x[idx]
            x[idx] = torch.where(seen > 0, seen / p.repetition_penalty, seen * p.repetition_penalty)
        if (self.presence or self.frequency) and generated:
            # OpenAI's definition: logit -= count * frequency + (count > 0) * presence, over the
            # tokens generated so far.
            counts = torch.bincount(
                torch.tensor(list(generated), dtype=torch.long), minlength=x.numel()
            ).to(device=x.device, dtype=x.dtype)[: x.numel()]
            x -= counts * self.frequency + (counts > 0).to(x.dtype) * self.presence
        for token, bias in self.bias:
            x[token] += bias
        if self.matcher is not None:
            x = self.matcher.mask(x)
        return x

    def _sample(self, x: torch.Tensor) -> int:
        p = self.params
        if p.temperature == 0:
            return int(torch.argmax(x))
        x = x / p.temperature
        if self.min_p > 0:
            probs = torch.softmax(x, dim=-1)
            x = x.masked_fill(probs < self.min_p * probs.max(), float("-inf"))
        if p.top_k > 0 and p.top_k < x.numel():
            kth = torch.topk(x, p.top_k).values[-1]
            x = x.masked_fill(x < kth, float("-inf"))
        if p.top_p < 1.0:
            sorted_x, order = torch.sort(x, descending=False)
            cum = torch.softmax(sorted_x, dim=-1).cumsum(-1)
            drop = cum <= 1 - p.top_p
            drop[-1] = False  # the most likely token always stays
            x = x.masked_fill(torch.zeros_like(drop).scatter(0, order, drop), float("-inf"))
        probs = torch.softmax(x, dim=-1).cpu()
        return int(torch.multinomial(probs, 1, generator=self.generator))


def top_logprobs(logits: torch.Tensor, token: int, k: int) -> tuple[float, list[tuple[int, float]]]:
    """The model's log-probability of ``token`` and its ``k`` most likely tokens (raw logits,
    before penalties and temperature, as vLLM reports them)."""
    lp = torch.log_softmax(logits.float(), dim=-1)
    top: list[tuple[int, float]] = []
    if k > 0:
        values, ids = torch.topk(lp, min(k, lp.numel()))
        top = [(int(i), float(v)) for i, v in zip(ids.tolist(), values.tolist())]
    return float(lp[token]), top


def token_logprobs(
    logits: torch.Tensor, targets: Sequence[int], k: int
) -> list[tuple[float, list[tuple[int, float]]]]:
    """:func:`top_logprobs` for many rows at once: row i of ``logits`` [n, V] scores
    ``targets[i]``. One log-softmax and one top-k over the rows, one read from the device."""
    lp = torch.log_softmax(logits.float(), dim=-1)
    idx = torch.tensor(list(targets), dtype=torch.long, device=lp.device)
    chosen = lp.gather(1, idx[:, None])[:, 0].tolist()
    if k <= 0:
        return [(v, []) for v in chosen]
    values, ids = torch.topk(lp, min(k, lp.shape[-1]), dim=-1)
    return [(v, list(zip(i, t))) for v, i, t in zip(chosen, ids.tolist(), values.tolist())]
