"""Continuous batching, SplitFuse packing, preemption, sampling, stops and streaming."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from inference_models import hf_greedy, prompts

from ds.inference import ContinuousBatchScheduler, SamplingParams, build_engine, generate
from ds.inference.sampling import Sampler
from ds.interfaces.errors import ConfigError, InferenceError
from ds.interfaces.inference import Scheduler


def test_splitfuse_packs_decodes_and_chunks_under_budget(tiny_dirs: dict[str, Path]) -> None:
    engine = build_engine(tiny_dirs["llama"], {"scheduler": {"token_budget": 64}})
    sched = ContinuousBatchScheduler(engine)
    assert isinstance(sched, Scheduler)
    seen: list[list[tuple[int, int]]] = []
    orig = engine.put_logits

    def spy(uids: Any, tokens: Any, flags: Any = None) -> Any:
        seen.append([(u, len(t)) for u, t in zip(uids, tokens)])
        return orig(uids, tokens, flags)

    engine.put_logits = spy  # type: ignore[method-assign]
    sched.add_request(0, list(range(10)), SamplingParams(max_new_tokens=8))
    sched.add_request(1, list(range(200)), SamplingParams(max_new_tokens=3))
    while sched.has_unfinished():
        sched.step()
    assert all(sum(n for _, n in step) <= 64 for step in seen)
    # Step 1: all of prompt 0 and a 54-token chunk of prompt 1; then uid 0 decodes while
    # prompt 1 continues in chunks that fill the rest of the budget.
    assert seen[0] == [(0, 10), (1, 54)]
    assert seen[1] == [(0, 1), (1, 63)]
    assert seen[2] == [(0, 1), (1, 63)]
    assert seen[3] == [(0, 1), (1, 20)]
    assert [len(sched.finished[u].generated) for u in (0, 1)] == [8, 3]


def test_preemption_under_a_small_cache_keeps_greedy_output(
    tiny_dirs: dict[str, Path], hf_models: dict[str, Any]
) -> None:
    ps = [p[:60] for p in prompts(6, 20, 60, seed=3)]
    want = [hf_greedy(hf_models["llama"], p, 24) for p in ps]
    # 14 blocks of 16 tokens cannot hold six 84-token sequences at once.
    engine = build_engine(tiny_dirs["llama"], {"kv_cache": {"block_size": 16, "num_blocks": 14}})
    sched = ContinuousBatchScheduler(engine)
    for i, p in enumerate(ps):
        sched.add_request(i, p, SamplingParams(max_new_tokens=24))
    while sched.has_unfinished():
        sched.step()
        assert engine.capacity().free_blocks >= 0
    assert [sched.finished[i].generated for i in range(len(ps))] == want
    assert sum(sched.finished[i].preemptions for i in range(len(ps))) > 0
    assert engine.capacity().free_blocks == 14


def test_request_larger_than_cache_is_refused(tiny_dirs: dict[str, Path]) -> None:
    engine = build_engine(tiny_dirs["llama"], {"kv_cache": {"block_size": 16, "num_blocks": 4}})
    sched = ContinuousBatchScheduler(engine)
    with pytest.raises(InferenceError, match="whole cache holds 64"):
        sched.add_request(0, list(range(60)), SamplingParams(max_new_tokens=8))


def test_streaming_callbacks_and_stop_tokens(tiny_dirs: dict[str, Path]) -> None:
    engine = build_engine(tiny_dirs["qwen2"])
    ps = prompts(3, 5, 40)
    free = generate(engine, ps, SamplingParams(max_new_tokens=12))
    stop = free[1].tokens[4]
    streamed: dict[int, list[int]] = {}
    done: list[int] = []

    held_at_end: list[int] = []

    def on_token(i: int, tok: int, finished: bool) -> None:
        streamed.setdefault(i, []).append(tok)
        if finished:
            done.append(i)
            # A client told its request ended can count on its KV blocks being free already.
            held_at_end.append(engine.capacity().total_blocks - engine.capacity().free_blocks)

    out = generate(
        engine, ps, SamplingParams(max_new_tokens=12, stop_token_ids=(stop,)), on_token=on_token
    )
    cut = free[1].tokens.index(stop) + 1
    assert out[1].tokens == free[1].tokens[:cut] and out[1].finish_reason == "stop"
    assert all(streamed[i] == out[i].tokens for i in range(3))
    assert sorted(done) == [0, 1, 2]
    assert held_at_end[-1] == 0  # the last request's blocks were freed before it was told


def test_stop_strings_use_the_decoder(tiny_dirs: dict[str, Path]) -> None:
    engine = build_engine(tiny_dirs["llama"])
    decode = lambda toks: " ".join(map(str, toks))  # noqa: E731
    free = generate(engine, [list(range(9))], SamplingParams(max_new_tokens=10), decode=decode)[0]
    stop = f" {free.tokens[3]} "
    out = generate(
        engine,
        [list(range(9))],
        SamplingParams(max_new_tokens=10, stop_strings=(stop,)),
        decode=decode,
    )[0]
    assert out.finish_reason == "stop" and stop not in (out.text or "")
    full = decode(free.tokens)
    assert out.text == full[: full.find(stop)]
    assert len(out.tokens) < len(free.tokens)


def test_seeded_sampling_is_reproducible_and_distinct(tiny_dirs: dict[str, Path]) -> None:
    engine = build_engine(tiny_dirs["llama"])
    p = [list(range(20))]
    a = generate(engine, p, SamplingParams(max_new_tokens=16, temperature=1.5, seed=7))[0]
    b = generate(engine, p, SamplingParams(max_new_tokens=16, temperature=1.5, seed=7))[0]
    c = generate(engine, p, SamplingParams(max_new_tokens=16, temperature=1.5, seed=8))[0]
    assert a.tokens == b.tokens and a.tokens != c.tokens
    greedy = generate(engine, p, SamplingParams(max_new_tokens=16))[0]
    top1 = generate(engine, p, SamplingParams(max_new_tokens=16, temperature=0.7, top_k=1))[0]
    assert top1.tokens == greedy.tokens


def test_sampler_filters_match_transformers_processors() -> None:
    from transformers.generation.logits_process import (
        RepetitionPenaltyLogitsProcessor,
        TemperatureLogitsWarper,
        TopKLogitsWarper,
        TopPLogitsWarper,
    )

    torch.manual_seed(0)
    logits = torch.randn(64) * 3
    history = [1, 5, 5, 9, 40]
    params = SamplingParams(temperature=0.8, top_k=20, top_p=0.7, repetition_penalty=1.3, seed=0)
    ids = torch.tensor([history])
    ref = RepetitionPenaltyLogitsProcessor(1.3)(ids, logits[None].clone())
    for proc in (TemperatureLogitsWarper(0.8), TopKLogitsWarper(20), TopPLogitsWarper(0.7)):
        ref = proc(ids, ref)
    allowed = torch.isfinite(ref[0])
    counts = torch.zeros(64)
    sampler = Sampler(params)
    for _ in range(400):
        counts[sampler(logits, history)] += 1
    assert bool((counts[~allowed] == 0).all())
    probs = torch.softmax(ref[0], -1)
    assert torch.allclose(counts / 400, probs, atol=0.08)


def test_invalid_sampling_parameters() -> None:
    with pytest.raises(ConfigError, match=r"temperature=-1.*top_p=1.5"):
        Sampler(SamplingParams(top_p=1.5, temperature=-1))
    # NaN fails every comparison, so "< 0" alone would let it through into the logits.
    with pytest.raises(ConfigError, match=r"temperature=nan .*repetition_penalty=nan"):
        Sampler(SamplingParams(temperature=float("nan"), repetition_penalty=float("nan")))
    with pytest.raises(ConfigError, match=r"temperature=inf \(must be finite"):
        Sampler(SamplingParams(temperature=float("inf")))
    with pytest.raises(ConfigError, match=r"repetition_penalty=inf"):
        Sampler(SamplingParams(repetition_penalty=float("inf")))


def test_abort_frees_blocks_and_other_requests_continue(tiny_dirs: dict[str, Path]) -> None:
    engine = build_engine(tiny_dirs["llama"], {"kv_cache": {"num_blocks": 64}})
    sched = ContinuousBatchScheduler(engine)
    sched.add_request(0, list(range(40)), SamplingParams(max_new_tokens=20))
    sched.add_request(1, list(range(30)), SamplingParams(max_new_tokens=5))
    sched.step()
    assert sched.abort(0) and not sched.abort(0)
    assert 0 not in engine.state
    while sched.has_unfinished():
        sched.step()
    assert list(sched.finished) == [1] and len(sched.finished[1].generated) == 5
    assert engine.capacity().free_blocks == 64
