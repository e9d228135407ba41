"""Tiny random Llama / Qwen2 models built with transformers (no downloads) and prompt helpers."""

from __future__ import annotations

from typing import Any

import torch

TINY = dict(
    vocab_size=512,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=1024,
)


def make_model(family: str, seed: int = 0, **overrides: Any) -> Any:
    import transformers

    torch.manual_seed(seed)
    kw: dict[str, Any] = {**TINY, **overrides}
    if family == "llama":
        cfg = transformers.LlamaConfig(**kw)
        model = transformers.LlamaForCausalLM(cfg)
    elif family == "qwen2":
        kw.setdefault("tie_word_embeddings", True)
        cfg = transformers.Qwen2Config(**kw)
        model = transformers.Qwen2ForCausalLM(cfg)
    else:
        raise ValueError(family)
    # Random init is tiny (std 0.02): scale weights up so logits have clear margins and greedy
    # decoding does not hinge on ties between near-equal logits.
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" not in name:
                p.mul_(4.0)
    return model.eval()


def prompts(
    n: int = 8, lo: int = 3, hi: int = 300, vocab: int = 512, seed: int = 0
) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    lengths = torch.linspace(lo, hi, n).round().long().tolist()
    return [torch.randint(0, vocab, (int(n_),), generator=g).tolist() for n_ in lengths]


def hf_greedy(model: Any, prompt: list[int], new_tokens: int) -> list[int]:
    ids = torch.tensor([prompt])
    with torch.no_grad():
        out = model.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=new_tokens,
            min_new_tokens=new_tokens,
            do_sample=False,
            pad_token_id=0,
            eos_token_id=None,
        )
    return out[0, len(prompt) :].tolist()
