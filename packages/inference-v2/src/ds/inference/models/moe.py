"""Mixture-of-experts families: Mixtral and Qwen2-MoE (Llama attention, a routed MLP).

Routing is transformers' own: softmax of the router logits in fp32, top-k, renormalised over the
chosen experts (always for Mixtral, with ``norm_topk_prob`` for Qwen2-MoE), each token's output
the weighted sum of its experts'. Qwen2-MoE adds a shared expert gated by a sigmoid.

Checkpoints come either per expert (the Hub layout: ``experts.{e}.w1/w3/w2`` for Mixtral,
``experts.{e}.gate_proj/up_proj/down_proj`` for Qwen2-MoE) or fused as transformers 5 holds them
in memory (``experts.gate_up_proj`` [E, 2I, H] and ``experts.down_proj`` [E, H, I]).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from ds.inference.models.blocks import DenseLinear, Weights
from ds.inference.models.llama import GatedMLP, LlamaModel
from ds.interfaces.errors import ConfigError

Act = Callable[[torch.Tensor], torch.Tensor]


class SparseMoE:
    def __init__(
        self,
        router: DenseLinear,
        experts: list[GatedMLP],
        top_k: int,
        normalize: bool,
        shared: GatedMLP | None = None,
        shared_gate: DenseLinear | None = None,
        cast_weights: bool = False,
    ) -> None:
        if not 1 <= top_k <= len(experts):
            raise ConfigError(f"num_experts_per_tok={top_k} must be in [1, {len(experts)}]")
        self.router = router
        self.experts = experts
        self.top_k = top_k
        self.normalize = normalize
        self.shared = shared
        self.shared_gate = shared_gate
        # Qwen2-MoE casts the routing weights to the activations' dtype; Mixtral keeps fp32.
        self.cast_weights = cast_weights

    def route(self, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Each token's ``top_k`` experts [T, k] and their weights [T, k]."""
        probs = torch.softmax(self.router(h).float(), dim=-1)
        weights, experts = torch.topk(probs, self.top_k, dim=-1)
        if self.normalize:
            weights = weights / weights.sum(dim=-1, keepdim=True)
        return experts, weights.to(h.dtype) if self.cast_weights else weights

    def __call__(self, h: torch.Tensor) -> torch.Tensor:
        experts, weights = self.route(h)
        out = torch.zeros_like(h)
        flat = experts.flatten()
        order = torch.argsort(flat, stable=True)
        counts = torch.bincount(flat, minlength=len(self.experts)).tolist()  # one host sync
        k = self.top_k
        start = 0
        for e, n in enumerate(counts):
            if not n:
                continue
            picks = order[start : start + n]
            start += n
            tokens = picks // k
            y = self.experts[e](h[tokens]) * weights.flatten()[picks, None]
            out.index_add_(0, tokens, y.to(out.dtype))
        if self.shared is not None and self.shared_gate is not None:
            out = out + torch.sigmoid(self.shared_gate(h)) * self.shared(h)
        return out


def load_experts(
    w: Weights, p: str, n: int, names: tuple[str, str, str], act: Act
) -> list[GatedMLP]:
    """``n`` experts under prefix ``p`` ("...experts."), per expert or fused."""
    fused = f"{p}gate_up_proj"
    if fused in w:
        gate_up = w.take(fused)
        down = w.take(f"{p}down_proj")
        if gate_up.shape[0] != n or down.shape[0] != n:
            raise ConfigError(f"{fused} holds {gate_up.shape[0]} experts; the config says {n}")
        inter = gate_up.shape[1] // 2
        return [
            GatedMLP(
                w.make(gate_up[e, :inter], None),
                w.make(gate_up[e, inter:], None),
                w.make(down[e], None),
                act,
            )
            for e in range(n)
        ]
    gate, up, down_name = names
    return [
        GatedMLP(
            w.linear(f"{p}{e}.{gate}"),
            w.linear(f"{p}{e}.{up}"),
            w.linear(f"{p}{e}.{down_name}"),
            act,
        )
        for e in range(n)
    ]


class MixtralModel(LlamaModel):
    def build_mlp(self, w: Weights, p: str, i: int) -> Callable[[torch.Tensor], torch.Tensor]:
        cfg = self.config
        n = int(cfg.get("num_local_experts", 8))
        # The Hub layout names the block "block_sparse_moe"; transformers 5 in memory, "mlp".
        block = f"{p}block_sparse_moe." if f"{p}block_sparse_moe.gate.weight" in w else f"{p}mlp."
        return SparseMoE(
            w.dense(f"{block}gate"),
            load_experts(w, f"{block}experts.", n, ("w1", "w3", "w2"), self.act),
            int(cfg.get("num_experts_per_tok", 2)),
            normalize=True,
        )


class Qwen2MoeModel(LlamaModel):
    def build_mlp(self, w: Weights, p: str, i: int) -> Callable[[torch.Tensor], torch.Tensor]:
        cfg = self.config
        n = int(cfg.get("num_experts", 60))
        step = int(cfg.get("decoder_sparse_step", 1))
        sparse = i not in (cfg.get("mlp_only_layers") or []) and n > 0 and (i + 1) % step == 0
        if not sparse:
            return super().build_mlp(w, p, i)
        b = f"{p}mlp."

        def gated(name: str) -> GatedMLP:
            return GatedMLP(
                w.linear(f"{name}.gate_proj"),
                w.linear(f"{name}.up_proj"),
                w.linear(f"{name}.down_proj"),
                self.act,
            )

        has_shared = f"{b}shared_expert.gate_proj.weight" in w
        return SparseMoE(
            w.dense(f"{b}gate"),
            load_experts(w, f"{b}experts.", n, ("gate_proj", "up_proj", "down_proj"), self.act),
            int(cfg.get("num_experts_per_tok", 4)),
            normalize=bool(cfg.get("norm_topk_prob", False)),
            shared=gated(f"{b}shared_expert") if has_shared else None,
            shared_gate=w.dense(f"{b}shared_expert_gate") if has_shared else None,
            cast_weights=True,
        )
