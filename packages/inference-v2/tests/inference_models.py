"""Tiny random Llama / Qwen2 models built with transformers (no downloads) and prompt helpers."""

from __future__ import annotations

from typing import Any

import tiny_models
import torch
from tiny_models import TINY, tiny_model

__all__ = ["TINY", "hf_greedy", "make_model", "prompts"]


def make_model(family: str, seed: int = 0, **overrides: Any) -> Any:
    """A tiny random ``llama`` or ``qwen2`` (tied embeddings unless overridden)."""
    if family == "llama":
        return tiny_model("LlamaConfig", "LlamaForCausalLM", seed=seed, **overrides)
    if family == "qwen2":
        overrides.setdefault("tie_word_embeddings", True)
        return tiny_model("Qwen2Config", "Qwen2ForCausalLM", seed=seed, **overrides)
    raise ValueError(family)


def prompts(
    n: int = 8, lo: int = 3, hi: int = 300, vocab: int = 512, seed: int = 0
) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    lengths = torch.linspace(lo, hi, n).round().long().tolist()
    return [torch.randint(0, vocab, (int(n_),), generator=g).tolist() for n_ in lengths]


def hf_greedy(model: Any, prompt: list[int], new_tokens: int) -> list[int]:
    """Exactly ``new_tokens`` greedy tokens (no EOS stop)."""
    return tiny_models.hf_greedy(
        model, prompt, new_tokens, min_new_tokens=new_tokens, eos_token_id=None
    )
