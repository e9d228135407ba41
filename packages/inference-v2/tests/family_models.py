"""Tiny random models of every served family, built with transformers from local configs.

Each case names a transformers config class, a model class and config overrides chosen to
exercise that family's peculiarities (sliding windows shorter than the prompts, per-layer
windows, fused projections, MoE routing, partial rotary, softcapping, rope scaling).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from tiny_models import TINY, tiny_model


@dataclass(frozen=True)
class Case:
    name: str
    family: str  # transformers' class prefix: <family>Config, <family>ForCausalLM
    overrides: dict[str, Any] = field(default_factory=dict)
    base: dict[str, Any] = field(default_factory=lambda: TINY)  # the overrides apply to it
    note: str = ""  # what the row exercises (the docs' parity table repeats it)
    chunked: bool = True  # greedy run with chunked prefill (off for length-dependent rope)

    @property
    def config(self) -> str:
        return f"{self.family}Config"

    @property
    def model(self) -> str:
        return f"{self.family}ForCausalLM"


# OPT and Falcon configs take TINY's shape under fewer (or other) keys.
_FALCON = {
    k: TINY[k] for k in ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads")
}
# Falcon-RW's layout: per-head fused qkv, attention then MLP, biases.
_RW = {"multi_query": False, "parallel_attn": False, "bias": True}
_OPT = {
    **_FALCON,
    "ffn_dim": TINY["intermediate_size"],
    "max_position_embeddings": TINY["max_position_embeddings"],
}


CASES: list[Case] = [
    Case("llama", "Llama", note="GQA, RoPE"),
    Case(
        "llama-yarn",
        "Llama",
        {
            "rope_scaling": {
                "rope_type": "yarn",
                "factor": 4.0,
                "original_max_position_embeddings": 256,
            }
        },
        note="yarn RoPE (factor 4, attention scaling)",
    ),
    Case(
        "llama-dynamic",
        "Llama",
        {"max_position_embeddings": 128, "rope_scaling": {"rope_type": "dynamic", "factor": 2.0}},
        note="dynamic NTK RoPE past 128 tokens",
        chunked=False,
    ),
    Case(
        "llama-linear",
        "Llama",
        {"rope_scaling": {"rope_type": "linear", "factor": 2.0}},
        note="linear RoPE scaling",
    ),
    Case(
        "mistral",
        "Mistral",
        {"sliding_window": 64},
        note="sliding window 64 on every layer",
    ),
    Case(
        "qwen2",
        "Qwen2",
        {
            "use_sliding_window": True,
            "sliding_window": 48,
            "max_window_layers": 1,
            "tie_word_embeddings": True,
        },
        note="q/k/v biases; window 48 on layer 1 only",
    ),
    Case(
        "qwen3",
        "Qwen3",
        {"head_dim": 32, "use_sliding_window": True, "sliding_window": 40, "max_window_layers": 1},
        note="q/k RMSNorm, head_dim 32 != hidden/heads, window 40 on layer 1",
    ),
    Case(
        "mixtral",
        "Mixtral",
        {"num_local_experts": 4, "num_experts_per_tok": 2, "sliding_window": 96},
        note="4 experts top-2, window 96",
    ),
    Case(
        "qwen2_moe",
        "Qwen2Moe",
        {
            "num_experts": 4,
            "num_experts_per_tok": 2,
            "moe_intermediate_size": 32,
            "shared_expert_intermediate_size": 64,
            "norm_topk_prob": False,
            "mlp_only_layers": [1],
        },
        note="4 experts top-2 + gated shared expert; layer 1 dense",
    ),
    Case(
        "phi",
        "Phi",
        {"num_key_value_heads": 4, "qk_layernorm": True},
        note="parallel attn+MLP, LayerNorm, partial rotary 0.5, q/k LayerNorm, biased head",
    ),
    Case(
        "phi3",
        "Phi3",
        {"sliding_window": 80, "pad_token_id": 0},
        note="fused qkv / gate_up, window 80",
    ),
    Case(
        "phi3-longrope",
        "Phi3",
        {
            "max_position_embeddings": 1024,
            "original_max_position_embeddings": 128,
            "pad_token_id": 0,
            "rope_scaling": {
                "rope_type": "longrope",
                "short_factor": [1.0 + 0.05 * i for i in range(8)],
                "long_factor": [1.0 + 0.5 * i for i in range(8)],
            },
        },
        note="longrope, long factors past 128 tokens",
        chunked=False,
    ),
    Case(
        "gemma",
        "Gemma",
        {"head_dim": 16},
        note="(1+w) RMSNorm, sqrt(hidden) embedding scale, tanh GELU",
    ),
    Case(
        "gemma2",
        "Gemma2",
        {"head_dim": 16, "sliding_window": 32, "query_pre_attn_scalar": 32},
        note="sandwich norms, attn softcap 50, final softcap 30, window 32 on even layers",
    ),
    Case(
        "opt",
        "OPT",
        {"word_embed_proj_dim": 64},
        base=_OPT,
        note="learned positions, pre-LayerNorm, ReLU",
    ),
    Case(
        "opt-350m-style",
        "OPT",
        {"word_embed_proj_dim": 32, "do_layer_norm_before": False},
        base=_OPT,
        note="post-LayerNorm, project_in/out 32<->64",
    ),
    Case(
        "falcon",
        "Falcon",
        base=_FALCON,
        note="7B layout: multi-query, parallel attention",
    ),
    Case(
        "falcon-new-arch",
        "Falcon",
        {"num_kv_heads": 2, "new_decoder_architecture": True},
        base=_FALCON,
        note="40B/180B layout: grouped KV, ln_attn + ln_mlp",
    ),
    Case(
        "falcon-sequential",
        "Falcon",
        _RW,
        base=_FALCON,
        note="per-head fused qkv, sequential blocks, biases",
    ),
    Case(
        "falcon-alibi",
        "Falcon",
        {**_RW, "hidden_size": 96, "num_attention_heads": 6, "alibi": True},
        base=_FALCON,
        note="RW layout with ALiBi, 6 heads (non-power-of-two slopes)",
    ),
]

BY_NAME = {c.name: c for c in CASES}


def build(case: Case, seed: int = 0) -> Any:
    kw = {**case.base, **case.overrides}
    return tiny_model(case.config, case.model, seed=seed, base=False, **kw)


def measure(case: Case, new_tokens: int = 8) -> tuple[float, bool]:
    """Max |logit diff| (eight prompts of 3-300 tokens, prefill and a decode step) and whether
    greedy generation (3, 167 and 300 token prompts) is token-identical: the docs' table row."""
    from inference_models import hf_greedy, prompts

    from ds.inference import SamplingParams, build_engine, generate

    model = build(case)
    config = {
        "kv_cache": {"block_size": 16, "num_blocks": 256},
        "state_manager": {"max_ragged_batch_size": 4096},
        "max_model_len": 1024,
    }
    engine = build_engine(model, config)
    ps = prompts()
    got = engine.put(list(range(len(ps))), ps)
    nxt = [int(x) for x in got.argmax(-1)]
    step = engine.put(list(range(len(ps))), [[t] for t in nxt])
    worst = 0.0
    with torch.no_grad():
        for i, p in enumerate(ps):
            out = model(torch.tensor([p]), use_cache=True)
            worst = max(worst, float((got[i] - out.logits[0, -1]).abs().max()))
            ref = model(torch.tensor([[nxt[i]]]), cache=out.cache, use_cache=True).logits[0, -1]
            worst = max(worst, float((step[i] - ref).abs().max()))
    short = [ps[i] for i in (0, 4, 7)]
    want = [hf_greedy(model, p, new_tokens) for p in short]
    sched = {"chunked_prefill": case.chunked, "token_budget": 64 if case.chunked else 512}
    res = generate(
        model, short, SamplingParams(max_new_tokens=new_tokens), {**config, "scheduler": sched}
    )
    return worst, [r.tokens for r in res] == want


if __name__ == "__main__":  # prints the docs' parity table rows
    import sys

    sys.path.insert(0, __file__.rsplit("/", 1)[0])
    for c in CASES:
        diff, same = measure(c)
        print(f"| `{c.name}` | {c.note} | {diff:.1e} | {'yes' if same else 'NO'} |", flush=True)
