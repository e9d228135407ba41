"""Batch generation: run prompts through the continuous-batching scheduler to completion."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ds.inference.config import EngineConfig
from ds.inference.engine import InferenceEngineV2, build_engine
from ds.inference.sampling import option
from ds.inference.scheduler import ContinuousBatchScheduler, TokenCallback
from ds.interfaces.errors import InferenceError
from ds.interfaces.inference import SamplingParams


@dataclass(frozen=True)
class GenerationResult:
    prompt: list[int]
    tokens: list[int]
    finish_reason: str
    cached_prefix_tokens: int = 0
    text: str | None = None
    # With SamplingOptions.prompt_logprobs: (logprob, top alternatives) of prompt tokens 1..
    prompt_logprobs: list[tuple[float, list[tuple[int, float]]]] | None = None


def generate(
    model: InferenceEngineV2 | str | Path | Any,
    prompts: Sequence[Sequence[int]],
    params: SamplingParams | Sequence[SamplingParams] | None = None,
    config: EngineConfig | dict[str, Any] | None = None,
    decode: Callable[[list[int]], str] | None = None,
    on_token: TokenCallback | None = None,
    stop_at_eos: bool = False,
) -> list[GenerationResult]:
    """Generate for every prompt (token ids); results in prompt order.

    ``model`` is an engine, a Hugging Face directory or an in-memory ``transformers`` model.
    ``on_token(index, token, finished)`` streams tokens as they are produced (token None: a
    prompt scored with ``max_new_tokens=0`` ended). With
    ``stop_at_eos`` a request ends at the model's EOS token (config.json and
    generation_config.json), as ``ds serve`` does; off by default, so that exactly
    ``max_new_tokens`` come back. A request that fails raises InferenceError after all others
    ran.
    """
    engine = model if isinstance(model, InferenceEngineV2) else build_engine(model, config)
    if params is None:
        params = SamplingParams()
    plist = [params] * len(prompts) if isinstance(params, SamplingParams) else list(params)
    if len(plist) != len(prompts):
        raise InferenceError(f"{len(prompts)} prompts but {len(plist)} sampling parameter sets")
    eos = engine.eos_token_ids if stop_at_eos else ()
    sched = ContinuousBatchScheduler(engine, decode=decode, eos_token_ids=eos)
    base = 1 + max(engine.state.uids(), default=-1)
    for i, (prompt, p) in enumerate(zip(prompts, plist)):
        sched.add_request(base + i, prompt, p, on_token and _shift(on_token, base))
    while sched.has_unfinished():
        sched.step()
    if sched.failed:
        uid, req = min(sched.failed.items())
        raise InferenceError(f"prompt {uid - base} failed: {req.error}")
    out = []
    for i, p in enumerate(plist):
        req = sched.finished[base + i]
        text = req.text if decode is not None else None
        out.append(
            GenerationResult(
                list(req.prompt),
                list(req.generated),
                req.finish_reason or "length",
                req.cached_prefix,
                text,
                list(req.prompt_logprobs) if option(p, "prompt_logprobs") is not None else None,
            )
        )
    return out


def _shift(cb: TokenCallback, base: int) -> TokenCallback:
    return lambda uid, tok, fin: cb(uid - base, tok, fin)
