"""Qwen (the first generation, ``model_type: qwen``, Hub code ``QWenLMHeadModel``).

Its layers are Qwen2's: RMSNorm, full-width RoPE, one fused ``c_attn`` with q/k/v biases, an
unbiased output projection and a SiLU-gated MLP; only the names and a few config keys differ.
The checkpoint and config are renamed into the Qwen2 layout and served by the Llama family:

* ``c_attn`` [3H, H] splits into q, k, v; ``mlp.w2`` is the gate and ``mlp.w1`` the up
  projection (the Hub code computes ``c_proj(w1(x) * silu(w2(x)))``);
* ``intermediate_size`` counts both MLP halves (each is ``intermediate_size // 2`` wide);
* ``seq_length`` is the trained context. ``use_logn_attn`` and ``use_dynamic_ntk`` change
  attention only past it, so the context is capped there and neither is needed.
"""

from __future__ import annotations

import re
from typing import Any

import torch

from ds.inference.models.llama import LlamaModel
from ds.interfaces.errors import ConfigError

_RENAMES = [
    (r"transformer\.wte\.weight", "model.embed_tokens.weight"),
    (r"transformer\.ln_f\.weight", "model.norm.weight"),
    (r"transformer\.h\.(\d+)\.ln_1\.weight", r"model.layers.\1.input_layernorm.weight"),
    (r"transformer\.h\.(\d+)\.ln_2\.weight", r"model.layers.\1.post_attention_layernorm.weight"),
    (r"transformer\.h\.(\d+)\.attn\.c_proj\.", r"model.layers.\1.self_attn.o_proj."),
    (r"transformer\.h\.(\d+)\.mlp\.w1\.", r"model.layers.\1.mlp.up_proj."),
    (r"transformer\.h\.(\d+)\.mlp\.w2\.", r"model.layers.\1.mlp.gate_proj."),
    (r"transformer\.h\.(\d+)\.mlp\.c_proj\.", r"model.layers.\1.mlp.down_proj."),
]
_C_ATTN = re.compile(r"transformer\.h\.(\d+)\.attn\.c_attn\.(weight|bias)")


def qwen2_config(config: dict[str, Any]) -> dict[str, Any]:
    """A Qwen (v1) config.json as the Qwen2 keys the Llama family reads."""
    hidden, heads = int(config["hidden_size"]), int(config["num_attention_heads"])
    pct = float(config.get("rotary_pct", 1.0))
    if pct != 1.0:
        raise ConfigError(
            f"qwen: rotary_pct={pct} is not served (ds rotates the whole head, rotary_pct=1.0, "
            "as every released Qwen checkpoint does)"
        )
    head_dim = int(config.get("kv_channels") or hidden // heads)
    if head_dim * heads != hidden:
        raise ConfigError(
            f"qwen: kv_channels={head_dim} x num_attention_heads={heads} != hidden_size={hidden}; "
            "the checkpoint's attention cannot be split into heads"
        )
    if int(config["intermediate_size"]) % 2:
        raise ConfigError(
            f"qwen: intermediate_size={config['intermediate_size']} is odd; it counts both "
            "halves of the gated MLP (w1 and w2), each intermediate_size // 2 wide"
        )
    seq = int(config.get("seq_length") or config.get("max_position_embeddings") or 2048)
    return {
        "model_type": "qwen",
        "hidden_size": hidden,
        "num_attention_heads": heads,
        "num_key_value_heads": heads,
        "num_hidden_layers": int(config["num_hidden_layers"]),
        "vocab_size": int(config["vocab_size"]),
        "intermediate_size": int(config["intermediate_size"]) // 2,
        "rms_norm_eps": float(config.get("layer_norm_epsilon", 1e-6)),
        "rope_theta": float(config.get("rotary_emb_base", 10000.0)),
        "max_position_embeddings": seq,
        "hidden_act": "silu",
        "tie_word_embeddings": bool(config.get("tie_word_embeddings", False)),
        **{k: config[k] for k in ("eos_token_id", "bos_token_id") if k in config},
    }


def qwen2_weights(weights: dict[str, torch.Tensor], hidden: int) -> dict[str, torch.Tensor]:
    out: dict[str, torch.Tensor] = {}
    for name, t in weights.items():
        m = _C_ATTN.fullmatch(name)
        if m is not None:
            if t.shape[0] != 3 * hidden:
                raise ConfigError(
                    f"qwen: {name} has {t.shape[0]} rows, expected 3 x hidden_size = {3 * hidden}"
                )
            for part, chunk in zip(("q", "k", "v"), t.split(hidden, dim=0)):
                out[f"model.layers.{m.group(1)}.self_attn.{part}_proj.{m.group(2)}"] = chunk
            continue
        for pattern, repl in _RENAMES:
            new, n = re.subn(f"^{pattern}", repl, name)
            if n:
                out[new] = t
                break
        else:
            out[name] = t  # lm_head.weight, and anything unknown for Weights to report
    return out


class QwenModel(LlamaModel):
    def convert(
        self, config: dict[str, Any], weights: dict[str, torch.Tensor]
    ) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
        cfg = qwen2_config(config)
        return cfg, qwen2_weights(weights, cfg["hidden_size"])
