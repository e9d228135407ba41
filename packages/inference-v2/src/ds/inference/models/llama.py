"""The Llama family and its near relatives: RMSNorm, RoPE, grouped-query attention, gated MLP.

One class serves ``llama``, ``mistral``, ``qwen2`` (biases on q/k/v, picked up when present) and
``qwen3`` (per-head RMSNorm on q and k). Subclasses change one piece each: the MLP (``moe.py``:
mixtral, qwen2_moe), fused projections (``phi.py``: phi3), the norm and embedding scale
(``gemma.py``). Weights keep their Hugging Face names.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from ds.inference.kv_cache import KVCache
from ds.inference.models.blocks import (
    DenseLinear,
    LinearFn,
    Weights,
    activation,
    rms_norm,
)
from ds.inference.models.decoder import RaggedDecoder, Tables, sliding_windows
from ds.inference.ragged import RaggedBatch
from ds.inference.rope import Rotary, rope_parameters
from ds.interfaces.errors import ConfigError

# Re-exported: older code imports them from here.
__all__ = ["DenseLinear", "GatedMLP", "LlamaModel", "rms_norm"]

Act = Callable[[torch.Tensor], torch.Tensor]
Rule = Callable[[int], bool]


def _qwen_rule(config: dict[str, Any]) -> Rule:
    use = bool(config.get("use_sliding_window", False))
    first = int(config.get("max_window_layers", 28))
    return lambda i: use and i >= first


def _qwen_moe_rule(config: dict[str, Any]) -> Rule:
    use = bool(config.get("use_sliding_window", False))
    last = int(config.get("max_window_layers", 28))
    return lambda i: use and bool((i + 1) % 2) and i < last


# Which layers slide when config.json has no ``layer_types`` (transformers' per-family default);
# a family not listed slides on every layer when ``sliding_window`` is set (Mistral, Mixtral, Phi-3).
WINDOW_RULES: dict[str, Callable[[dict[str, Any]], Rule]] = {
    "qwen2": _qwen_rule,
    "qwen3": _qwen_rule,
    "qwen2_moe": _qwen_moe_rule,
    "gemma2": lambda config: lambda i: bool((i + 1) % 2),
}


class GatedMLP:
    __slots__ = ("act", "down", "gate", "up")

    def __init__(self, gate: LinearFn, up: LinearFn, down: LinearFn, act: Act) -> None:
        self.gate, self.up, self.down, self.act = gate, up, down, act

    def __call__(self, h: torch.Tensor) -> torch.Tensor:
        return self.down(self.act(self.gate(h)) * self.up(h))


class _Layer:
    q: LinearFn
    k: LinearFn
    v: LinearFn
    o: LinearFn
    mlp: Callable[[torch.Tensor], torch.Tensor]
    ln_in: torch.Tensor
    ln_post: torch.Tensor
    q_norm: torch.Tensor | None
    k_norm: torch.Tensor | None
    ln_pre_ff: torch.Tensor | None  # Gemma 2's sandwich norms
    ln_post_ff: torch.Tensor | None

    # A dense layer's MLP projections, by their short names.
    @property
    def gate(self) -> LinearFn:
        assert isinstance(self.mlp, GatedMLP)
        return self.mlp.gate

    @property
    def up(self) -> LinearFn:
        assert isinstance(self.mlp, GatedMLP)
        return self.mlp.up

    @property
    def down(self) -> LinearFn:
        assert isinstance(self.mlp, GatedMLP)
        return self.mlp.down


class LlamaModel(RaggedDecoder):
    norm = staticmethod(rms_norm)

    def configure(self, config: dict[str, Any], device: torch.device | str) -> None:
        self.config = config
        self.num_kv_heads = int(config.get("num_key_value_heads") or self.num_heads)
        self.head_dim = int(config.get("head_dim") or self.hidden // self.num_heads)
        if self.num_heads % self.num_kv_heads:
            raise ConfigError(
                f"num_attention_heads={self.num_heads} is not a multiple of "
                f"num_key_value_heads={self.num_kv_heads}"
            )
        self.eps = float(config.get("rms_norm_eps", 1e-6))
        self.act = activation(self.activation_name(config))
        self.scale = self.head_dim**-0.5
        rule = WINDOW_RULES.get(str(config.get("model_type")))
        self.windows = sliding_windows(config, self.num_layers, rule(config) if rule else None)
        self.rotary = Rotary(self.head_dim, self.rope_params(config), device)

    def load(self, w: Weights) -> None:
        if "lm_head.weight" not in w and not self.config.get("tie_word_embeddings", True):
            raise ConfigError("checkpoint has no lm_head.weight and tie_word_embeddings=false")
        # The output head stays dense: it is small next to the layers and most sensitive.
        self.lm_head = self.tied_head(w)
        self.norm_w = w.take("norm.weight")
        self.layers = [self._build_layer(w, i) for i in range(self.num_layers)]

    # -- what subclasses change ---------------------------------------------------------------
    def activation_name(self, config: dict[str, Any]) -> Any:
        return config.get("hidden_act", "silu")

    def rope_params(self, config: dict[str, Any]) -> dict[str, Any]:
        return rope_parameters(config)

    def attention_weights(self, w: Weights, p: str) -> tuple[LinearFn, LinearFn, LinearFn]:
        return (
            w.linear(f"{p}self_attn.q_proj"),
            w.linear(f"{p}self_attn.k_proj"),
            w.linear(f"{p}self_attn.v_proj"),
        )

    def build_mlp(self, w: Weights, p: str, i: int) -> Callable[[torch.Tensor], torch.Tensor]:
        return GatedMLP(
            w.linear(f"{p}mlp.gate_proj"),
            w.linear(f"{p}mlp.up_proj"),
            w.linear(f"{p}mlp.down_proj"),
            self.act,
        )

    # -- the layer ------------------------------------------------------------------------------
    def _build_layer(self, w: Weights, i: int) -> _Layer:
        p = f"layers.{i}."
        layer = _Layer()
        layer.q, layer.k, layer.v = self.attention_weights(w, p)
        layer.o = w.linear(f"{p}self_attn.o_proj")
        layer.q_norm = w.maybe(f"{p}self_attn.q_norm.weight")
        layer.k_norm = w.maybe(f"{p}self_attn.k_norm.weight")
        layer.mlp = self.build_mlp(w, p, i)
        layer.ln_in = w.take(f"{p}input_layernorm.weight")
        layer.ln_post = w.take(f"{p}post_attention_layernorm.weight")
        layer.ln_pre_ff = w.maybe(f"{p}pre_feedforward_layernorm.weight")
        layer.ln_post_ff = w.maybe(f"{p}post_feedforward_layernorm.weight")
        return layer

    def layer(
        self, i: int, x: torch.Tensor, batch: RaggedBatch, cache: KVCache, rope: Tables
    ) -> torch.Tensor:
        L = self.layers[i]
        t = x.shape[0]
        h = self.norm(x, L.ln_in, self.eps)
        q = L.q(h).view(t, self.num_heads, self.head_dim)
        k = L.k(h).view(t, self.num_kv_heads, self.head_dim)
        v = L.v(h).view(t, self.num_kv_heads, self.head_dim)
        if L.q_norm is not None and L.k_norm is not None:
            q = self.norm(q, L.q_norm, self.eps)
            k = self.norm(k, L.k_norm, self.eps)
        a = L.o(self.attend(i, q, k, v, batch, cache, rope))
        if L.ln_pre_ff is not None and L.ln_post_ff is not None:
            x = x + self.norm(a, L.ln_post, self.eps)
            m = L.mlp(self.norm(x, L.ln_pre_ff, self.eps))
            return x + self.norm(m, L.ln_post_ff, self.eps)
        x = x + a
        return x + L.mlp(self.norm(x, L.ln_post, self.eps))

    def head(self, x: torch.Tensor) -> torch.Tensor:
        return self.lm_head(self.norm(x, self.norm_w, self.eps))
