"""Qwen (first generation, ``model_type: qwen``) against transformers.

transformers ships no Qwen (v1) model (the Hub's is remote code), but its layers are Qwen2's under
other names. A tiny random Qwen2 is written out in the Qwen (v1) checkpoint layout and config
(fused ``c_attn``, ``w1``/``w2``/``c_proj``, ``intermediate_size`` counting both MLP halves,
``seq_length``), and ds serving that directory must match transformers' Qwen2 on the original:
logits of prompts of 3-300 tokens within 1e-4 and greedy tokens identical.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from inference_models import TINY, hf_greedy, prompts

from ds.inference import SamplingParams, build_engine, generate
from ds.interfaces.errors import ConfigError

transformers = pytest.importorskip("transformers")
safetensors_torch = pytest.importorskip("safetensors.torch")

TOL = 1e-4
ENGINE = {
    "kv_cache": {"block_size": 16, "num_blocks": 256},
    "state_manager": {"max_ragged_batch_size": 4096},
    "max_model_len": 1024,
}


def _qwen2() -> Any:
    torch.manual_seed(0)
    # Qwen (1) has no grouped-query attention: as many KV heads as heads.
    cfg = transformers.Qwen2Config(
        **{**TINY, "num_key_value_heads": TINY["num_attention_heads"]},
        rope_theta=10000.0,
        rms_norm_eps=1e-6,
        tie_word_embeddings=False,
        use_sliding_window=False,
    )
    return transformers.Qwen2ForCausalLM(cfg).eval()


def _as_qwen1(model: Any, out: Path, **config: Any) -> Path:
    """``model`` (Qwen2) saved as a Qwen (v1) checkpoint directory."""
    sd = model.state_dict()
    n = model.config.num_hidden_layers
    w: dict[str, torch.Tensor] = {
        "transformer.wte.weight": sd["model.embed_tokens.weight"],
        "transformer.ln_f.weight": sd["model.norm.weight"],
        "lm_head.weight": sd["lm_head.weight"],
    }
    for i in range(n):
        a, h = f"model.layers.{i}.self_attn.", f"transformer.h.{i}."
        for kind in ("weight", "bias"):
            w[f"{h}attn.c_attn.{kind}"] = torch.cat(
                [sd[f"{a}{p}_proj.{kind}"] for p in ("q", "k", "v")]
            )
        w[f"{h}attn.c_proj.weight"] = sd[f"{a}o_proj.weight"]
        m = f"model.layers.{i}.mlp."
        w[f"{h}mlp.w1.weight"] = sd[f"{m}up_proj.weight"]
        w[f"{h}mlp.w2.weight"] = sd[f"{m}gate_proj.weight"]
        w[f"{h}mlp.c_proj.weight"] = sd[f"{m}down_proj.weight"]
        w[f"{h}ln_1.weight"] = sd[f"model.layers.{i}.input_layernorm.weight"]
        w[f"{h}ln_2.weight"] = sd[f"model.layers.{i}.post_attention_layernorm.weight"]
    c = model.config
    cfg = {
        "model_type": "qwen",
        "architectures": ["QWenLMHeadModel"],
        "hidden_size": c.hidden_size,
        "num_attention_heads": c.num_attention_heads,
        "num_hidden_layers": n,
        "kv_channels": c.hidden_size // c.num_attention_heads,
        "intermediate_size": 2 * c.intermediate_size,
        "vocab_size": c.vocab_size,
        "layer_norm_epsilon": c.rms_norm_eps,
        "rotary_emb_base": 10000,
        "rotary_pct": 1.0,
        "seq_length": 1024,
        "use_dynamic_ntk": True,
        "use_logn_attn": True,
        "no_bias": True,
        **config,
    }
    out.mkdir(parents=True, exist_ok=True)
    safetensors_torch.save_file(
        {k: v.contiguous() for k, v in w.items()}, out / "model.safetensors"
    )
    (out / "config.json").write_text(json.dumps(cfg))
    return out


@pytest.fixture(scope="module")
def qwen(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, Path]:
    model = _qwen2()
    return model, _as_qwen1(model, tmp_path_factory.mktemp("qwen") / "qwen-tiny")


def test_logits_match_transformers(qwen: tuple[Any, Path]) -> None:
    model, path = qwen
    engine = build_engine(path, ENGINE)
    ps = prompts()  # eight prompts of 3-300 tokens, one ragged forward
    logits = engine.put(list(range(len(ps))), ps)
    for i, p in enumerate(ps):
        with torch.no_grad():
            want = model(torch.tensor([p])).logits[0, -1]
        torch.testing.assert_close(logits[i], want, atol=TOL, rtol=0)
    assert engine.model.max_context == 1024  # seq_length: logn / dynamic NTK never apply


def test_greedy_matches_transformers(qwen: tuple[Any, Path]) -> None:
    model, path = qwen
    ps = [prompts()[i] for i in (0, 4, 7)]  # 3, 167 and 300 tokens
    config = {**ENGINE, "scheduler": {"token_budget": 64}}  # prompts split over chunks
    got = generate(path, ps, SamplingParams(max_new_tokens=8), config)
    assert [r.tokens for r in got] == [hf_greedy(model, p, 8) for p in ps]


@pytest.mark.parametrize(
    ("override", "needle"),
    [
        ({"rotary_pct": 0.5}, "rotary_pct=0.5"),
        ({"kv_channels": 8}, "kv_channels=8"),
        ({"intermediate_size": 257}, "intermediate_size=257"),
    ],
)
def test_unserved_configs_are_one_line_errors(
    qwen: tuple[Any, Path], tmp_path: Path, override: dict[str, Any], needle: str
) -> None:
    model, _ = qwen
    path = _as_qwen1(model, tmp_path / "bad", **override)
    with pytest.raises(ConfigError, match=needle) as err:
        build_engine(path, ENGINE)
    assert "\n" not in str(err.value)
