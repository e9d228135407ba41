"""Prompt logprobs (echo + logprobs, prompt scoring): every prompt position's logits, against
transformers' log_softmax, with chunked prefill and with prefix caching on."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from inference_models import hf_greedy, prompts

from ds.inference import SamplingParams, build_engine, generate
from ds.inference.sampling import SamplingOptions
from ds.inference.scheduler import ContinuousBatchScheduler

TOL = 1e-4
# A token budget far below the prompt lengths: prompts are scored across many chunks.
CONFIG = {
    "kv_cache": {"block_size": 16, "num_blocks": 128},
    "scheduler": {"token_budget": 24},
    "prefix_caching": True,
}


def _hf_logprobs(model: Any, prompt: list[int]) -> torch.Tensor:
    with torch.no_grad():
        logits = model(torch.tensor([prompt])).logits[0].float()
    return torch.log_softmax(logits, dim=-1)


def _check(scored: list[tuple[float, list[tuple[int, float]]]], hf: Any, prompt: list[int]) -> None:
    ref = _hf_logprobs(hf, prompt)
    assert len(scored) == len(prompt) - 1
    for i, (lp, top) in enumerate(scored):
        assert abs(lp - float(ref[i, prompt[i + 1]])) < TOL, i
        values, ids = torch.topk(ref[i], len(top))
        assert [t for t, _ in top] == ids.tolist(), i
        assert all(abs(v - float(w)) < TOL for (_, v), w in zip(top, values)), i


def test_put_logits_returns_every_position(tiny_dirs: dict[str, Path], hf_models: Any) -> None:
    engine = build_engine(tiny_dirs["llama"], {"kv_cache": {"block_size": 16, "num_blocks": 32}})
    a, b = prompts(2, 30, 50, seed=3)
    last, full = engine.put_logits([0, 1], [a[:20], b], [True, False])
    assert full[1] is None and full[0] is not None and full[0].shape == (20, 512)
    ref_a = hf_models["llama"](torch.tensor([a])).logits[0].float()
    ref_b = hf_models["llama"](torch.tensor([b])).logits[0].float()
    assert torch.allclose(full[0], ref_a[:20], atol=TOL)
    assert torch.allclose(last[0], ref_a[19], atol=TOL)
    assert torch.allclose(last[1], ref_b[-1], atol=TOL)
    # The next chunk's rows continue at the positions after the cached ones.
    last, full = engine.put_logits([0], [a[20:]], [True])
    assert full[0] is not None and torch.allclose(full[0], ref_a[20:], atol=TOL)


def test_prompt_scoring_matches_transformers_with_chunks_and_prefix_cache(
    tiny_dirs: dict[str, Path], hf_models: Any
) -> None:
    engine = build_engine(tiny_dirs["llama"], CONFIG)
    batch = prompts(4, 2, 90, seed=5)
    score = SamplingOptions(max_new_tokens=0, prompt_logprobs=3)
    for _ in range(2):  # the second round finds every prompt's blocks in the prefix cache
        out = generate(engine, batch, score)
        for prompt, res in zip(batch, out):
            assert res.tokens == [] and res.finish_reason == "length"
            assert res.cached_prefix_tokens == 0  # scored prompts take no prefix-cache hits
            assert res.prompt_logprobs is not None
            _check(res.prompt_logprobs, hf_models["llama"], prompt)
    assert engine.capacity().free_blocks == engine.capacity().total_blocks


def test_scoring_beside_generation_changes_neither(
    tiny_dirs: dict[str, Path], hf_models: Any
) -> None:
    engine = build_engine(tiny_dirs["llama"], CONFIG)
    batch = prompts(4, 10, 70, seed=7)
    plain = SamplingParams(max_new_tokens=6)
    both = SamplingOptions(max_new_tokens=6, prompt_logprobs=0)
    out = generate(engine, batch, [plain, both, plain, both])
    for i, (prompt, res) in enumerate(zip(batch, out)):
        assert res.tokens == hf_greedy(hf_models["llama"], prompt, 6)
        if i % 2:
            assert res.prompt_logprobs is not None
            assert all(top == [] for _, top in res.prompt_logprobs)
            _check(res.prompt_logprobs, hf_models["llama"], prompt)
        else:
            assert res.prompt_logprobs is None


def test_preempted_scoring_request_keeps_its_scores(
    tiny_dirs: dict[str, Path], hf_models: Any
) -> None:
    # A cache of 8 blocks for two 60-token prompts generating 40 tokens each: decodes preempt
    # the newer request, which recomputes its prompt.
    engine = build_engine(
        tiny_dirs["llama"],
        {"kv_cache": {"block_size": 16, "num_blocks": 8}, "scheduler": {"token_budget": 32}},
    )
    batch = prompts(2, 60, 60, seed=9)
    sched = ContinuousBatchScheduler(engine)
    for uid, prompt in enumerate(batch):
        sched.add_request(uid, prompt, SamplingOptions(max_new_tokens=40, prompt_logprobs=2))
    while sched.has_unfinished():
        sched.step()
    assert max(r.preemptions for r in sched.finished.values()) > 0
    for uid, prompt in enumerate(batch):
        req = sched.finished[uid]
        assert req.generated == hf_greedy(hf_models["llama"], prompt, 40)
        _check(req.prompt_logprobs, hf_models["llama"], prompt)


def test_max_new_tokens_zero_needs_prompt_logprobs() -> None:
    from ds.inference.sampling import validate
    from ds.interfaces.errors import ConfigError

    with pytest.raises(ConfigError, match="max_new_tokens=0"):
        validate(SamplingOptions(max_new_tokens=0))
    validate(SamplingOptions(max_new_tokens=0, prompt_logprobs=0))
