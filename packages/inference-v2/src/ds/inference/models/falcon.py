"""Falcon (7B's multi-query layout, 40B/180B's "new decoder architecture", and the sequential
RW variant): fused ``query_key_value``, LayerNorm, GELU MLP, attention and MLP in parallel.

The fused projection is laid out three ways, as in transformers: grouped (new architecture:
per KV group its queries, then one key and one value), multi-query (all queries, then one key and
one value) and per head (query, key, value of each head in turn). ALiBi Falcons (``alibi: true``,
the RW family) take ALiBi's position bias instead of rotary embeddings.
"""

from __future__ import annotations

from typing import Any

import torch

from ds.inference.attention import alibi_slopes
from ds.inference.kv_cache import KVCache
from ds.inference.models.blocks import Weights, activation, layer_norm
from ds.inference.models.decoder import RaggedDecoder, Tables
from ds.inference.ragged import RaggedBatch
from ds.inference.rope import Rotary, rope_parameters
from ds.interfaces.errors import ConfigError


def _ln(w: Weights, name: str) -> tuple[torch.Tensor, torch.Tensor | None] | None:
    if f"{name}.weight" not in w:
        return None
    return w.take(f"{name}.weight"), w.maybe(f"{name}.bias")


class _FalconLayer:
    def __init__(self, w: Weights, p: str) -> None:
        self.qkv = w.linear(f"{p}self_attention.query_key_value")
        self.dense = w.linear(f"{p}self_attention.dense")
        self.up = w.linear(f"{p}mlp.dense_h_to_4h")
        self.down = w.linear(f"{p}mlp.dense_4h_to_h")
        self.ln_in = _ln(w, f"{p}input_layernorm")
        self.ln_post = _ln(w, f"{p}post_attention_layernorm")
        self.ln_attn = _ln(w, f"{p}ln_attn")
        self.ln_mlp = _ln(w, f"{p}ln_mlp")


class FalconModel(RaggedDecoder):
    shape_keys = (
        "hidden_size",
        "num_attention_heads|n_head",
        "num_hidden_layers|n_layer",
        "vocab_size",
    )
    weight_prefixes = ("transformer.",)
    embed_name = "word_embeddings.weight"

    def configure(self, config: dict[str, Any], device: torch.device | str) -> None:
        self.head_dim = self.hidden // self.num_heads
        self.new_arch = bool(config.get("new_decoder_architecture", False))
        self.multi_query = bool(config.get("multi_query", True))
        self.parallel = bool(config.get("parallel_attn", True))
        kv = config.get("num_kv_heads", config.get("n_head_kv")) or self.num_heads
        if self.new_arch:
            self.num_kv_heads = int(kv)
        else:
            self.num_kv_heads = 1 if self.multi_query else self.num_heads
        if self.num_heads % self.num_kv_heads:
            raise ConfigError(
                f"num_attention_heads={self.num_heads} is not a multiple of num_kv_heads={kv}"
            )
        num_ln = config.get("num_ln_in_parallel_attn")
        self.num_ln = 2 if num_ln is None and self.new_arch else int(num_ln or 1)
        self.eps = float(config.get("layer_norm_epsilon", 1e-5))
        self.act = activation(config.get("activation", "gelu"))
        self.scale = self.head_dim**-0.5
        if config.get("alibi"):
            self.rotary = None
            self.alibi = alibi_slopes(self.num_heads).to(device)
        else:
            self.rotary = Rotary(self.head_dim, rope_parameters(config), device)
        self.windows = [None] * self.num_layers

    def load(self, w: Weights) -> None:
        self.layers = [_FalconLayer(w, f"h.{i}.") for i in range(self.num_layers)]
        self.ln_f = (w.take("ln_f.weight"), w.maybe("ln_f.bias"))
        self.lm_head = self.tied_head(w)

    def _split(self, fused: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        t, d, h = fused.shape[0], self.head_dim, self.num_heads
        if self.new_arch:
            g = fused.view(t, self.num_kv_heads, h // self.num_kv_heads + 2, d)
            return g[:, :, :-2].reshape(t, h, d), g[:, :, -2], g[:, :, -1]
        if self.multi_query:
            g = fused.view(t, h + 2, d)
            return g[:, :-2], g[:, -2:-1], g[:, -1:]
        g = fused.view(t, h, 3, d)
        return g[:, :, 0], g[:, :, 1], g[:, :, 2]

    def layer(
        self, i: int, x: torch.Tensor, batch: RaggedBatch, cache: KVCache, rope: Tables
    ) -> torch.Tensor:
        L = self.layers[i]
        h_mlp: torch.Tensor | None = None
        if self.new_arch and self.num_ln == 2:
            assert L.ln_attn is not None and L.ln_mlp is not None
            h_attn = layer_norm(x, *L.ln_attn, self.eps)
            h_mlp = layer_norm(x, *L.ln_mlp, self.eps)
        else:
            assert L.ln_in is not None
            h_attn = layer_norm(x, *L.ln_in, self.eps)
        q, k, v = self._split(L.qkv(h_attn))
        a = L.dense(self.attend(i, q, k, v, batch, cache, rope))
        residual = x
        if not self.new_arch:
            if self.parallel:
                h_mlp = h_attn
            else:
                assert L.ln_post is not None
                residual = x + a
                h_mlp = layer_norm(residual, *L.ln_post, self.eps)
        elif self.parallel and self.num_ln == 1:
            h_mlp = h_attn
        if h_mlp is None:
            raise ConfigError(
                "Falcon new_decoder_architecture without parallel_attn needs two norms"
            )
        m = L.down(self.act(L.up(h_mlp)))
        if self.new_arch or self.parallel:
            m = m + a
        return residual + m

    def head(self, x: torch.Tensor) -> torch.Tensor:
        return self.lm_head(layer_norm(x, *self.ln_f, self.eps))
