"""A tiny GPT for the multi-process tests (no dropout: runs are deterministic)."""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn


class Block(nn.Module):
    def __init__(self, d: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d, bias=False)  # a key bias has zero gradient: noise under Adam
        self.proj = nn.Linear(d, d)
        self.ln2 = nn.LayerNorm(d)
        self.fc = nn.Linear(d, 4 * d)
        self.out = nn.Linear(4 * d, d)

    def forward(self, x_BTD: torch.Tensor) -> torch.Tensor:
        B, T, D = x_BTD.shape
        q, k, v = self.qkv(self.ln1(x_BTD)).split(D, dim=-1)
        q, k, v = (t.view(B, T, self.heads, D // self.heads).transpose(1, 2) for t in (q, k, v))
        att = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x_BTD = x_BTD + self.proj(att.transpose(1, 2).reshape(B, T, D))
        return x_BTD + self.out(F.gelu(self.fc(self.ln2(x_BTD))))


class TinyGPT(nn.Module):
    def __init__(
        self,
        vocab: int = 64,
        d: int = 32,
        layers: int = 2,
        heads: int = 2,
        seq: int = 16,
        block: Callable[[int, int], nn.Module] = Block,
    ):
        """``layers`` blocks made by ``block(d, heads)`` between the embeddings and the head."""
        super().__init__()
        self.tok = nn.Embedding(vocab, d)
        self.pos = nn.Embedding(seq, d)
        self.blocks = nn.ModuleList(block(d, heads) for _ in range(layers))
        self.ln = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab, bias=False)

    def forward(self, idx_BT: torch.Tensor, targets_BT: torch.Tensor) -> torch.Tensor:
        T = idx_BT.shape[1]
        x = self.tok(idx_BT) + self.pos(torch.arange(T, device=idx_BT.device))
        for block in self.blocks:
            x = block(x)
        logits = self.head(self.ln(x)).float()
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets_BT.reshape(-1))


def batch(
    step: int, rows: int, vocab: int = 64, seq: int = 16
) -> tuple[torch.Tensor, torch.Tensor]:
    """The global batch of ``step``: a learnable pattern (next token = token + 1) plus noise."""
    g = torch.Generator().manual_seed(1000 + step)
    start = torch.randint(0, vocab, (rows, 1), generator=g)
    idx = (start + torch.arange(seq + 1)) % vocab
    noise = torch.randint(0, vocab, idx.shape, generator=g)
    idx = torch.where(torch.rand(idx.shape, generator=g) < 0.1, noise, idx)
    return idx[:, :-1].contiguous(), idx[:, 1:].contiguous()
