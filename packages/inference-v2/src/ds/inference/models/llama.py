"""The Llama family (Llama 2/3, Mistral, Qwen2): RMSNorm, RoPE, grouped-query attention, SwiGLU.

Weights keep their Hugging Face names. Qwen2 differs only by biases on the q/k/v projections, which
are picked up when present.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

from ds.inference.attention import paged_attention, write_kv
from ds.inference.kv_cache import KVCache
from ds.inference.ragged import RaggedBatch
from ds.inference.rope import Rotary, apply_rotary, rope_parameters
from ds.interfaces.errors import ConfigError, InferenceError

LinearFn = Callable[[torch.Tensor], torch.Tensor]
LinearFactory = Callable[[torch.Tensor, "torch.Tensor | None"], LinearFn]

_ACTIVATIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "silu": F.silu,
    "swish": F.silu,
    "gelu": F.gelu,
    "gelu_pytorch_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "relu": F.relu,
}


class DenseLinear:
    __slots__ = ("bias", "weight")

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None) -> None:
        self.weight = weight
        self.bias = bias

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight, self.bias)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    # Same operation order as the reference implementation, so fp32 results agree bit-for-bit-ish.
    dtype = x.dtype
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight * h.to(dtype)


class _Layer:
    def __init__(self, w: dict[str, torch.Tensor], prefix: str, make: LinearFactory) -> None:
        def lin(name: str) -> LinearFn:
            weight = w.pop(f"{prefix}{name}.weight")
            return make(weight, w.pop(f"{prefix}{name}.bias", None))

        self.q = lin("self_attn.q_proj")
        self.k = lin("self_attn.k_proj")
        self.v = lin("self_attn.v_proj")
        self.o = lin("self_attn.o_proj")
        self.gate = lin("mlp.gate_proj")
        self.up = lin("mlp.up_proj")
        self.down = lin("mlp.down_proj")
        self.ln_in = w.pop(f"{prefix}input_layernorm.weight")
        self.ln_post = w.pop(f"{prefix}post_attention_layernorm.weight")


class LlamaModel:
    def __init__(
        self,
        config: dict[str, Any],
        weights: dict[str, torch.Tensor],
        dtype: torch.dtype,
        device: torch.device | str,
        linear_factory: LinearFactory | None = None,
    ) -> None:
        make: LinearFactory = linear_factory or DenseLinear
        try:
            self.hidden = int(config["hidden_size"])
            self.num_heads = int(config["num_attention_heads"])
            self.num_layers = int(config["num_hidden_layers"])
            self.vocab_size = int(config["vocab_size"])
        except KeyError as exc:
            raise ConfigError(f"model config.json lacks {exc.args[0]!r}") from exc
        self.num_kv_heads = int(config.get("num_key_value_heads") or self.num_heads)
        self.head_dim = int(config.get("head_dim") or self.hidden // self.num_heads)
        self.eps = float(config.get("rms_norm_eps", 1e-6))
        act = config.get("hidden_act", "silu")
        if act not in _ACTIVATIONS:
            raise ConfigError(f"unsupported hidden_act {act!r}; supported: {sorted(_ACTIVATIONS)}")
        self.act = _ACTIVATIONS[act]
        window = config.get("sliding_window") if config.get("use_sliding_window", True) else None
        self.sliding_window = int(window) if window else None
        self.dtype = dtype
        self.scale = self.head_dim**-0.5
        w = {k.removeprefix("model."): v.to(device=device, dtype=dtype) for k, v in weights.items()}
        self.embed = w.pop("embed_tokens.weight")
        head = w.pop("lm_head.weight", None)
        if head is None:
            if not config.get("tie_word_embeddings", True):
                raise ConfigError("checkpoint has no lm_head.weight and tie_word_embeddings=false")
            head = self.embed
        # The output head stays dense: it is small next to the layers and most sensitive.
        self.lm_head = DenseLinear(head, None)
        self.norm = w.pop("norm.weight")
        self.layers = [_Layer(w, f"layers.{i}.", make) for i in range(self.num_layers)]
        leftover = [k for k in w if "rotary_emb" not in k]
        if leftover:
            raise ConfigError(f"unexpected weights in checkpoint: {leftover[:5]}")
        self.rotary = Rotary(self.head_dim, rope_parameters(config), device)
        self.attention: Callable[..., torch.Tensor] = paged_attention

    def forward(self, batch: RaggedBatch, cache: KVCache) -> torch.Tensor:
        if self.sliding_window is not None and batch.max_context > self.sliding_window:
            raise InferenceError(
                f"context of {batch.max_context} tokens exceeds the model's sliding window "
                f"({self.sliding_window}); windowed attention is not implemented"
            )
        t = batch.num_tokens
        x = self.embed[batch.token_ids]
        cos, sin = self.rotary.cos_sin(batch.positions, x.dtype)
        for i, layer in enumerate(self.layers):
            h = rms_norm(x, layer.ln_in, self.eps)
            q = layer.q(h).view(t, self.num_heads, self.head_dim)
            k = layer.k(h).view(t, self.num_kv_heads, self.head_dim)
            v = layer.v(h).view(t, self.num_kv_heads, self.head_dim)
            q = apply_rotary(q, cos, sin)
            k = apply_rotary(k, cos, sin)
            write_kv(cache.keys[i], cache.values[i], k, v, batch.slot_mapping)
            a = self.attention(q, cache.keys[i], cache.values[i], batch, self.scale)
            x = x + layer.o(a.reshape(t, self.num_heads * self.head_dim))
            h = rms_norm(x, layer.ln_post, self.eps)
            x = x + layer.down(self.act(layer.gate(h)) * layer.up(h))
        last = batch.query_start[1:] - 1
        x = rms_norm(x[last], self.norm, self.eps)
        return self.lm_head(x).float()
