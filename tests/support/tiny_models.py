"""Tiny random causal LMs built with transformers from a config (no downloads), for the
inference and serving tests: one shape, one seeding and one weight scaling for all of them; and
transformers' greedy decoding, the reference the engine's outputs are compared with."""

from __future__ import annotations

from typing import Any

import torch

# The shape every tiny Llama-like test model starts from (families override what they lack).
TINY = dict(
    vocab_size=512,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=1024,
)


def sharpen(model: Any) -> Any:
    """Scale the random weights up (in place) so that logits have clear margins.

    Random init is tiny (std 0.02): greedy decoding (and expert routing) would hinge on near-ties.
    Norm weights stay; zero-initialised ``1 + w`` norms get a spread so that their weights matter.
    """
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" not in name and "ln" not in name:
                p.mul_(4.0)
            elif p.dim() == 1 and p.abs().max() == 0:
                p.normal_(0.0, 0.2)
    return model


def tiny_model(
    config: str = "LlamaConfig",
    model: str = "LlamaForCausalLM",
    *,
    seed: int = 0,
    base: bool = True,
    **overrides: Any,
) -> Any:
    """``transformers.<model>(<config>(**TINY, **overrides))`` seeded with ``seed``, sharpened,
    in eval mode (``base=False``: the overrides alone)."""
    import transformers

    torch.manual_seed(seed)
    cfg = getattr(transformers, config)(**{**(TINY if base else {}), **overrides})
    return sharpen(getattr(transformers, model)(cfg)).eval()


def hf_greedy(model: Any, prompt: list[int], new_tokens: int, **kw: Any) -> list[int]:
    """transformers' greedy continuation of ``prompt`` (token ids), at most ``new_tokens`` long;
    ``kw``: more ``generate`` options (``eos_token_id``, ``min_new_tokens``, ...)."""
    ids = torch.tensor([prompt])
    with torch.no_grad():
        out = model.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=new_tokens,
            do_sample=False,
            pad_token_id=0,
            **kw,
        )
    return list(out[0, len(prompt) :].tolist())
