"""OPT: learned absolute positions (offset by 2), LayerNorm before (or, for OPT-350m, after) each
block, ReLU MLP, biases, and an optional projection between the embedding width and the model's.
"""

from __future__ import annotations

from typing import Any

import torch

from ds.inference.kv_cache import KVCache
from ds.inference.models.blocks import Weights, activation, layer_norm
from ds.inference.models.decoder import RaggedDecoder, Tables
from ds.inference.ragged import RaggedBatch

_POSITION_OFFSET = 2  # OPT's position table starts two rows in (fairseq's padding legacy)
_EPS = 1e-5  # nn.LayerNorm's default; OPT configs do not carry one


class _OPTLayer:
    def __init__(self, w: Weights, p: str) -> None:
        self.q = w.linear(f"{p}self_attn.q_proj")
        self.k = w.linear(f"{p}self_attn.k_proj")
        self.v = w.linear(f"{p}self_attn.v_proj")
        self.o = w.linear(f"{p}self_attn.out_proj")
        self.fc1 = w.linear(f"{p}fc1")
        self.fc2 = w.linear(f"{p}fc2")
        self.ln_attn = (
            w.maybe(f"{p}self_attn_layer_norm.weight"),
            w.maybe(f"{p}self_attn_layer_norm.bias"),
        )
        self.ln_mlp = (w.maybe(f"{p}final_layer_norm.weight"), w.maybe(f"{p}final_layer_norm.bias"))


class OPTModel(RaggedDecoder):
    weight_prefixes = ("model.decoder.", "decoder.")

    def configure(self, config: dict[str, Any], device: torch.device | str) -> None:
        self.num_kv_heads = self.num_heads
        self.head_dim = self.hidden // self.num_heads
        self.scale = self.head_dim**-0.5
        self.pre_norm = bool(config.get("do_layer_norm_before", True))
        self.act = activation(config.get("activation_function", "relu"))
        self.has_final_ln = self.pre_norm and not config.get("_remove_final_layer_norm", False)
        self.rotary = None
        self.windows = [None] * self.num_layers

    def load(self, w: Weights) -> None:
        self.positions = w.take("embed_positions.weight")
        self.project_in = w.dense("project_in", bias=False) if "project_in.weight" in w else None
        self.project_out = w.dense("project_out", bias=False) if "project_out.weight" in w else None
        self.layers = [_OPTLayer(w, f"layers.{i}.") for i in range(self.num_layers)]
        self.final_ln = (w.maybe("final_layer_norm.weight"), w.maybe("final_layer_norm.bias"))
        self.lm_head = self.tied_head(w)

    def embed(self, batch: RaggedBatch) -> torch.Tensor:
        x = self.embed_w[batch.token_ids]
        if self.project_in is not None:
            x = self.project_in(x)
        return x + self.positions[batch.positions + _POSITION_OFFSET]

    def layer(
        self, i: int, x: torch.Tensor, batch: RaggedBatch, cache: KVCache, rope: Tables
    ) -> torch.Tensor:
        L = self.layers[i]
        t = x.shape[0]
        h = layer_norm(x, *L.ln_attn, _EPS) if self.pre_norm else x
        # OPT scales the queries before the product (transformers does too; same rounding).
        q = (L.q(h) * self.scale).view(t, self.num_heads, self.head_dim)
        k = L.k(h).view(t, self.num_heads, self.head_dim)
        v = L.v(h).view(t, self.num_heads, self.head_dim)
        x = x + L.o(self.attend(i, q, k, v, batch, cache, rope, scale=1.0))
        if not self.pre_norm:
            x = layer_norm(x, *L.ln_attn, _EPS)
        h = layer_norm(x, *L.ln_mlp, _EPS) if self.pre_norm else x
        x = x + L.fc2(self.act(L.fc1(h)))
        if not self.pre_norm:
            x = layer_norm(x, *L.ln_mlp, _EPS)
        return x

    def head(self, x: torch.Tensor) -> torch.Tensor:
        if self.has_final_ln:
            x = layer_norm(x, *self.final_ln, _EPS)
        if self.project_out is not None:
            x = self.project_out(x)
        return self.lm_head(x)
