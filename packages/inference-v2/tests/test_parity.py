"""Greedy generation and last-token logits equal transformers on tiny random Llama and Qwen2."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from inference_models import hf_greedy, prompts

from ds.inference import SamplingParams, build_engine, generate

NEW_TOKENS = 10


@pytest.fixture(scope="module")
def references(hf_models: dict[str, Any]) -> dict[str, list[list[int]]]:
    ps = prompts()
    return {name: [hf_greedy(m, p, NEW_TOKENS) for p in ps] for name, m in hf_models.items()}


@pytest.mark.parametrize("family", ["llama", "qwen2"])
@pytest.mark.parametrize("block_size", [16, 64])
@pytest.mark.parametrize("chunked", [True, False])
@pytest.mark.parametrize("prefix", [False, True])
def test_greedy_matches_transformers(
    family: str,
    block_size: int,
    chunked: bool,
    prefix: bool,
    tiny_dirs: dict[str, Path],
    references: dict[str, list[list[int]]],
) -> None:
    config = {
        "kv_cache": {"block_size": block_size, "num_blocks": 4096 // block_size},
        # A small budget forces long prompts to be split over several forwards.
        "scheduler": {"chunked_prefill": chunked, "token_budget": 96},
        "prefix_caching": prefix,
    }
    engine = build_engine(tiny_dirs[family], config)
    ps = prompts()
    if prefix:
        # Warm the prefix cache with the prompts' leading blocks, then reuse them.
        warm = generate(engine, [p[: len(p) - 1] for p in ps], SamplingParams(max_new_tokens=1))
        assert all(r.cached_prefix_tokens == 0 for r in warm)
    results = generate(engine, ps, SamplingParams(max_new_tokens=NEW_TOKENS))
    assert [r.tokens for r in results] == references[family]
    if prefix:
        hits = [r.cached_prefix_tokens for r in results]
        assert hits == [((len(p) - 2) // block_size) * block_size for p in ps]
        assert sum(hits) > 0
    assert engine.capacity().active_sequences == 0


@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_last_token_logits_within_1e_4(
    family: str, tiny_dirs: dict[str, Path], hf_models: dict[str, Any]
) -> None:
    engine = build_engine(
        tiny_dirs[family],
        {
            "kv_cache": {"block_size": 16, "num_blocks": 256},
            "state_manager": {"max_ragged_batch_size": 2048},
        },
    )
    ps = prompts()
    # All eight prompts in one ragged forward.
    logits = engine.put(list(range(len(ps))), ps)
    ref = hf_models[family]
    for i, p in enumerate(ps):
        with torch.no_grad():
            want = ref(torch.tensor([p])).logits[0, -1]
        torch.testing.assert_close(logits[i], want, atol=1e-4, rtol=0)
    # One decode step for all of them, again against a full recompute.
    nxt = [int(x) for x in logits.argmax(-1)]
    step = engine.put(list(range(len(ps))), [[t] for t in nxt])
    for i, p in enumerate(ps):
        with torch.no_grad():
            want = ref(torch.tensor([[*p, nxt[i]]])).logits[0, -1]
        torch.testing.assert_close(step[i], want, atol=1e-4, rtol=0)


def test_in_memory_model_and_chunked_put_equal_directory(
    tiny_dirs: dict[str, Path], hf_models: dict[str, Any]
) -> None:
    from_dir = build_engine(tiny_dirs["llama"], {"kv_cache": {"num_blocks": 64}})
    in_mem = build_engine(hf_models["llama"], {"kv_cache": {"num_blocks": 64}})
    p = prompts()[-1]
    whole = from_dir.put([7], [p])
    for a in range(0, len(p), 37):  # uneven chunks through the same sequence
        last = in_mem.put([7], [p[a : a + 37]])
    torch.testing.assert_close(last, whole, atol=1e-5, rtol=0)


def test_llama3_rope_scaling_matches_transformers(tmp_path: Path) -> None:
    from inference_models import make_model

    scaling = {
        "rope_type": "llama3",
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 64,
    }
    model = make_model("llama", rope_scaling=scaling, rope_theta=500000.0)
    model.save_pretrained(tmp_path, safe_serialization=True)
    engine = build_engine(tmp_path, {"kv_cache": {"num_blocks": 64}})
    p = prompts()[-2]
    got = engine.put([0], [p])[0]
    with torch.no_grad():
        want = model(torch.tensor([p])).logits[0, -1]
    torch.testing.assert_close(got, want, atol=1e-4, rtol=0)


def test_mistral_greedy_matches_transformers(tmp_path: Path) -> None:
    import transformers
    from inference_models import TINY

    torch.manual_seed(2)
    model = transformers.MistralForCausalLM(
        transformers.MistralConfig(**TINY, sliding_window=1024)
    ).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" not in name:
                p.mul_(4.0)
    model.save_pretrained(tmp_path, safe_serialization=True)
    ps = prompts()[::3]
    want = [hf_greedy(model, p, 6) for p in ps]
    got = generate(
        tmp_path, ps, SamplingParams(max_new_tokens=6), {"kv_cache": {"num_blocks": 128}}
    )
    assert [r.tokens for r in got] == want


def test_bfloat16_engine_tracks_float32(tiny_dirs: dict[str, Path]) -> None:
    p = prompts()[4]
    f32 = build_engine(tiny_dirs["llama"], {"kv_cache": {"num_blocks": 64}}).put([0], [p])
    bf16 = build_engine(tiny_dirs["llama"], {"dtype": "bfloat16", "kv_cache": {"num_blocks": 64}})
    assert bf16.cache.keys[0].dtype == torch.bfloat16
    out = bf16.put([0], [p])
    assert out.dtype == torch.float32
    # bf16 keeps ~3 significant digits: logits agree loosely and rank the same top tokens.
    assert (out - f32).abs().max() < 0.25
    assert int(out.argmax()) == int(f32.argmax())
