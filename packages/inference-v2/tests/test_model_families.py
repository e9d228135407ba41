"""Every served family against transformers on tiny random models (fp32, CPU).

Per family (one row each, see family_models.CASES): the last-token logits of eight prompts of
3-300 tokens in one ragged forward, then one decode step, within 1e-4 of transformers' forward;
and greedy generation from a saved checkpoint, with chunked prefill, token for token equal to
transformers' ``generate``. The docs' architecture parity table lists these rows.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from family_models import BY_NAME, CASES, build
from inference_models import hf_greedy, prompts

from ds.inference import SamplingParams, build_engine, generate
from ds.interfaces.errors import ConfigError, KernelError

NAMES = [c.name for c in CASES]
NEW_TOKENS = 8
TOL = 1e-4
# Long enough for every sliding window and rope threshold of the cases to be crossed.
ENGINE = {
    "kv_cache": {"block_size": 16, "num_blocks": 256},
    "state_manager": {"max_ragged_batch_size": 4096},
    "max_model_len": 1024,
}


@pytest.fixture(scope="module")
def models() -> dict[str, Any]:
    return {}


def _model(models: dict[str, Any], name: str) -> Any:
    if name not in models:
        models[name] = build(BY_NAME[name])
    return models[name]


def _ref_logits(model: Any, p: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return model(torch.tensor([p])).logits[0, -1]


def _ref_cached_step(model: Any, p: list[int], token: int) -> torch.Tensor:
    with torch.no_grad():
        out = model(torch.tensor([p]), use_cache=True)
        return model(torch.tensor([[token]]), cache=out.cache, use_cache=True).logits[0, -1]


@pytest.mark.parametrize("name", NAMES)
def test_logits_match_transformers(name: str, models: dict[str, Any]) -> None:
    model = _model(models, name)
    engine = build_engine(model, ENGINE)
    ps = prompts()
    logits = engine.put(list(range(len(ps))), ps)  # all eight prompts in one ragged forward
    for i, p in enumerate(ps):
        torch.testing.assert_close(logits[i], _ref_logits(model, p), atol=TOL, rtol=0)
    nxt = [int(x) for x in logits.argmax(-1)]
    step = engine.put(list(range(len(ps))), [[t] for t in nxt])  # one decode step for all
    for i, p in enumerate(ps):
        if BY_NAME[name].chunked:
            want = _ref_logits(model, [*p, nxt[i]])  # a full recompute
        else:
            # Length-dependent rope: cached keys keep the rotation they were written with, so
            # the reference is transformers' own cached decode step, as generate() runs it.
            want = _ref_cached_step(model, p, nxt[i])
        torch.testing.assert_close(step[i], want, atol=TOL, rtol=0)


@pytest.mark.parametrize("name", NAMES)
def test_greedy_matches_transformers(name: str, models: dict[str, Any], tmp_path: Path) -> None:
    case = BY_NAME[name]
    model = _model(models, name)
    # Through a saved checkpoint: the Hub layout (per-expert MoE weights, tied heads).
    model.save_pretrained(tmp_path, safe_serialization=True)
    ps = [prompts()[i] for i in (0, 4, 7)]  # 3, 167 and 300 tokens
    want = [hf_greedy(model, p, NEW_TOKENS) for p in ps]
    config = {
        **ENGINE,
        # A small budget splits the long prompts over several forwards.
        "scheduler": {"chunked_prefill": case.chunked, "token_budget": 64 if case.chunked else 512},
    }
    got = generate(tmp_path, ps, SamplingParams(max_new_tokens=NEW_TOKENS), config)
    assert [r.tokens for r in got] == want


@pytest.mark.parametrize("name", ["mistral", "qwen2", "gemma2"])
def test_ignoring_the_window_breaks_parity(name: str, models: dict[str, Any]) -> None:
    """The windowed rows are sensitive: the same weights without the window disagree."""
    model = _model(models, name)
    engine = build_engine(model, ENGINE)
    engine.model.windows = [None] * engine.model.num_layers
    p = prompts()[-1]
    diff = (engine.put([0], [p])[0] - _ref_logits(model, p)).abs().max()
    assert diff > 100 * TOL


@pytest.mark.parametrize("name", ["mixtral", "qwen2_moe"])
def test_experts_routed_as_transformers(name: str, models: dict[str, Any]) -> None:
    """Given the hidden states transformers' router saw, ds picks the same experts per token."""
    model = _model(models, name)
    seen: list[tuple[torch.Tensor, torch.Tensor]] = []

    def hook(_mod: Any, args: tuple[torch.Tensor, ...], out: tuple[torch.Tensor, ...]) -> None:
        seen.append((args[0].reshape(-1, args[0].shape[-1]), out[2]))

    layer0 = model.model.layers[0].mlp
    handle = layer0.gate.register_forward_hook(hook)
    try:
        _ref_logits(model, prompts()[-1])
    finally:
        handle.remove()
    engine = build_engine(model, ENGINE)
    ((h, want_experts),) = seen
    got_experts, weights = engine.model.layers[0].mlp.route(h)
    assert torch.equal(got_experts, want_experts)
    assert weights.shape == want_experts.shape


def test_model_max_context_from_config() -> None:
    llama = build_engine(_tiny("llama"), ENGINE).model
    assert llama.max_context == 1024
    dynamic = build_engine(_tiny("llama-dynamic"), ENGINE).model
    assert dynamic.max_context == 256  # 128 trained positions, NTK factor 2
    # The engine's per-sequence limit (what the server advertises) follows the model's reading.
    assert build_engine(_tiny("llama-dynamic"), {"kv_cache": {"num_blocks": 64}}).max_context == 256
    yarn = build_engine(_tiny("llama-yarn"), ENGINE).model
    assert yarn.max_context == 1024  # max(1024, 256 * 4)
    mistral = build_engine(_tiny("mistral"), ENGINE).model
    # The window no longer limits the context: attention past it is windowed, not refused.
    assert mistral.max_context == 1024 and mistral.sliding_window == 64


def _tiny(name: str) -> Any:
    return build(BY_NAME[name])


def test_triton_attention_refuses_alibi() -> None:
    pytest.importorskip("triton")
    engine = build_engine(_tiny("falcon-alibi"), {**ENGINE, "attention": "triton"})
    with pytest.raises(KernelError, match="ALiBi"):
        engine.put([0], [[1, 2, 3]])


def test_unknown_rope_type_is_a_clear_error() -> None:
    model = _tiny("llama")
    config = model.config.to_dict()
    config["rope_parameters"] = {"rope_type": "ntk-by-parts", "rope_theta": 10000.0}
    from ds.inference.models.llama import LlamaModel

    with pytest.raises(ConfigError, match="unsupported rope type 'ntk-by-parts'"):
        LlamaModel(config, dict(model.state_dict()), torch.float32, "cpu")
