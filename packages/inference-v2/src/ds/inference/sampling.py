"""Token sampling: greedy, temperature, top-k, top-p, repetition penalty, per-request seeds."""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from ds.interfaces.errors import ConfigError
from ds.interfaces.inference import SamplingParams


def validate(params: SamplingParams) -> None:
    problems = []
    if params.max_new_tokens < 1:
        problems.append(f"max_new_tokens={params.max_new_tokens} (must be >= 1)")
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
    if problems:
        raise ConfigError("invalid sampling parameters: " + "; ".join(problems))


class Sampler:
    """Samples one request's tokens; owns its random generator so seeds are per request."""

    def __init__(self, params: SamplingParams) -> None:
        validate(params)
        self.params = params
        self.generator: torch.Generator | None = None
        if params.temperature > 0:
            self.generator = torch.Generator()
            if params.seed is not None:
                self.generator.manual_seed(params.seed)
            else:
                self.generator.seed()

    def __call__(self, logits: torch.Tensor, history: Sequence[int]) -> int:
        p = self.params
        x = logits.float()
        if p.repetition_penalty != 1.0 and history:
            idx = torch.tensor(sorted(set(history)), dtype=torch.long, device=x.device)
            seen = x[idx]
            x = x.clone()
            x[idx] = torch.where(seen > 0, seen / p.repetition_penalty, seen * p.repetition_penalty)
        if p.temperature == 0:
            return int(torch.argmax(x))
        x = x / p.temperature
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
