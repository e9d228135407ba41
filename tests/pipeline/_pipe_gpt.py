"""A tiny GPT as a list of pipeline layers: tied token embedding / LM head, causal attention."""

from __future__ import annotations

import torch
import torch.nn.functional as F

VOCAB, DIM, SEQ, BLOCKS = 32, 16, 8, 4


class Embed(torch.nn.Module):
    def __init__(self, vocab: int = VOCAB, dim: int = DIM, seq: int = SEQ) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(vocab, dim) * 0.2)
        self.pos = torch.nn.Parameter(torch.randn(seq, dim) * 0.1)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.weight[ids] + self.pos[: ids.shape[1]]


class Block(torch.nn.Module):
    def __init__(self, dim: int = DIM, heads: int = 2) -> None:
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = torch.nn.LayerNorm(dim), torch.nn.LayerNorm(dim)
        # No q/k/v bias: the k bias has an exactly zero gradient, on which Adam steps on noise.
        self.qkv = torch.nn.Linear(dim, 3 * dim, bias=False)
        self.proj = torch.nn.Linear(dim, dim)
        self.up, self.down = torch.nn.Linear(dim, 4 * dim), torch.nn.Linear(4 * dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, self.heads, d // self.heads).unbind(2)
        a = F.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True
        )
        x = x + self.proj(a.transpose(1, 2).reshape(b, t, d))
        return x + self.down(F.gelu(self.up(self.ln2(x))))


class TPBlock(torch.nn.Module):
    """The block with the projection names AutoTP's rules place (q/k/v/up column-wise, o/down
    row-wise), reshaping with this rank's head count (AutoTP localizes ``num_heads``)."""

    def __init__(self, dim: int = DIM, num_heads: int = 4) -> None:
        super().__init__()
        self.num_heads = num_heads
        self.ln1, self.ln2 = torch.nn.LayerNorm(dim), torch.nn.LayerNorm(dim)
        self.q_proj, self.k_proj, self.v_proj = (
            torch.nn.Linear(dim, dim, bias=False) for _ in range(3)
        )
        self.o_proj = torch.nn.Linear(dim, dim)
        self.up_proj, self.down_proj = torch.nn.Linear(dim, 4 * dim), torch.nn.Linear(4 * dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        h = self.ln1(x)
        q, k, v = (
            p(h).view(b, t, self.num_heads, -1).transpose(1, 2)
            for p in (self.q_proj, self.k_proj, self.v_proj)
        )
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.o_proj(a.transpose(1, 2).reshape(b, t, -1))
        return x + self.down_proj(F.gelu(self.up_proj(self.ln2(x))))


def head(embed: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    return x @ embed.weight.T


def loss_fn(logits: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits[:, :-1].reshape(-1, VOCAB), ids[:, 1:].reshape(-1))


def layers(block: type = Block, **block_kw):  # type: ignore[no-untyped-def]
    from ds.parallel.pipeline import LayerSpec, TiedLayerSpec

    return (
        [TiedLayerSpec("embed", Embed)]
        + [LayerSpec(block, **block_kw) for _ in range(BLOCKS)]
        + [LayerSpec(torch.nn.LayerNorm, DIM), TiedLayerSpec("embed", Embed, forward_fn=head)]
    )


def pipeline_module(  # type: ignore[no-untyped-def]
    stages: int, chunks: int = 1, seed: int = 11, block: type = Block, block_kw=None, **kw
):
    from ds.parallel.pipeline import PipelineModule

    return PipelineModule(
        layers(block, **(block_kw or {})), num_stages=stages, loss_fn=loss_fn, seed_layers=True, base_seed=seed,
        num_virtual_stages=chunks, **kw,
    )  # fmt: skip


def batch(step: int, rows: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(1000 + step)
    return torch.randint(0, VOCAB, (rows, SEQ), generator=g)
