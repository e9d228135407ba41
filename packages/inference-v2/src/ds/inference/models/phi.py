"""Phi (1, 1.5, 2) and Phi-3.

Phi: LayerNorm, attention and MLP in parallel from one norm (``x + attn + mlp``), biases
everywhere, partial rotary embeddings (``partial_rotary_factor``, 0.5 unless the config says),
optional LayerNorm on q and k, a biased output head.

Phi-3: Llama's layout with fused ``qkv_proj`` and ``gate_up_proj`` (split here at load), longrope
scaling for the long-context variants (rope type "su"/"yarn" in old configs means longrope), and
an optional sliding window on every layer.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from ds.inference.kv_cache import KVCache
from ds.inference.models.blocks import LinearFn, Weights, activation, layer_norm
from ds.inference.models.decoder import RaggedDecoder, Tables, sliding_windows
from ds.inference.models.llama import GatedMLP, LlamaModel
from ds.inference.ragged import RaggedBatch
from ds.inference.rope import Rotary, rope_parameters


class _PhiLayer:
    def __init__(self, w: Weights, p: str) -> None:
        self.q = w.linear(f"{p}self_attn.q_proj")
        self.k = w.linear(f"{p}self_attn.k_proj")
        self.v = w.linear(f"{p}self_attn.v_proj")
        self.o = w.linear(f"{p}self_attn.dense")
        self.q_ln = (
            w.maybe(f"{p}self_attn.q_layernorm.weight"),
            w.maybe(f"{p}self_attn.q_layernorm.bias"),
        )
        self.k_ln = (
            w.maybe(f"{p}self_attn.k_layernorm.weight"),
            w.maybe(f"{p}self_attn.k_layernorm.bias"),
        )
        self.fc1 = w.linear(f"{p}mlp.fc1")
        self.fc2 = w.linear(f"{p}mlp.fc2")
        self.ln = (w.take(f"{p}input_layernorm.weight"), w.maybe(f"{p}input_layernorm.bias"))


class PhiModel(RaggedDecoder):
    def configure(self, config: dict[str, Any], device: torch.device | str) -> None:
        self.num_kv_heads = int(config.get("num_key_value_heads") or self.num_heads)
        self.head_dim = int(config.get("head_dim") or self.hidden // self.num_heads)
        self.eps = float(config.get("layer_norm_eps", 1e-5))
        self.act = activation(config.get("hidden_act", "gelu_new"))
        self.scale = self.head_dim**-0.5
        params = rope_parameters(config)
        params.setdefault("partial_rotary_factor", 0.5)  # PhiConfig's default
        self.rotary = Rotary(self.head_dim, params, device)
        self.windows = sliding_windows(config, self.num_layers, None)

    def load(self, w: Weights) -> None:
        self.layers = [_PhiLayer(w, f"layers.{i}.") for i in range(self.num_layers)]
        self.final_ln = (w.take("final_layernorm.weight"), w.maybe("final_layernorm.bias"))
        self.lm_head = self.tied_head(w, w.maybe("lm_head.bias"))

    def layer(
        self, i: int, x: torch.Tensor, batch: RaggedBatch, cache: KVCache, rope: Tables
    ) -> torch.Tensor:
        L = self.layers[i]
        t = x.shape[0]
        h = layer_norm(x, *L.ln, self.eps)
        q = L.q(h).view(t, self.num_heads, self.head_dim)
        k = L.k(h).view(t, self.num_kv_heads, self.head_dim)
        v = L.v(h).view(t, self.num_kv_heads, self.head_dim)
        if L.q_ln[0] is not None:
            q = layer_norm(q, *L.q_ln, self.eps)
            k = layer_norm(k, *L.k_ln, self.eps)
        a = L.o(self.attend(i, q, k, v, batch, cache, rope))
        m = L.fc2(self.act(L.fc1(h)))
        return a + m + x

    def head(self, x: torch.Tensor) -> torch.Tensor:
        return self.lm_head(layer_norm(x, *self.final_ln, self.eps))


class Phi3Model(LlamaModel):
    def rope_params(self, config: dict[str, Any]) -> dict[str, Any]:
        params = rope_parameters(config)
        if params["rope_type"] in ("su", "yarn"):
            params["rope_type"] = "longrope"
            if config.get("original_max_position_embeddings") is not None:
                params["original_max_position_embeddings"] = config[
                    "original_max_position_embeddings"
                ]
            params.setdefault(
                "original_max_position_embeddings", config.get("max_position_embeddings")
            )
        return params

    def attention_weights(self, w: Weights, p: str) -> tuple[LinearFn, LinearFn, LinearFn]:
        qkv = w.take(f"{p}self_attn.qkv_proj.weight")
        bias = w.maybe(f"{p}self_attn.qkv_proj.bias")
        nq = self.num_heads * self.head_dim
        nk = self.num_kv_heads * self.head_dim
        cuts = [(0, nq), (nq, nq + nk), (nq + nk, nq + 2 * nk)]
        q, k, v = (w.make(qkv[a:b], None if bias is None else bias[a:b]) for a, b in cuts)
        return q, k, v

    def build_mlp(self, w: Weights, p: str, i: int) -> Callable[[torch.Tensor], torch.Tensor]:
        gate_up = w.take(f"{p}mlp.gate_up_proj.weight")
        inter = gate_up.shape[0] // 2
        return GatedMLP(
            w.make(gate_up[:inter], None),
            w.make(gate_up[inter:], None),
            w.linear(f"{p}mlp.down_proj"),
            self.act,
        )
