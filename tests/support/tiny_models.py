"""Tiny random causal LMs built with transformers from a config (no downloads), for the
inference and serving tests: one shape, one seeding and one weight scaling for all of them; and
transformers' greedy decoding, the reference the engine's outputs are compared with. Also the
config keywords of the other suites' tiny Llama-like models and the tiny MoE models' expert."""

from __future__ import annotations

from typing import Any

import torch


def llama_shape(
    hidden: int,
    intermediate: int,
    *,
    layers: int = 2,
    heads: int = 4,
    kv_heads: int | None = None,
    vocab: int | None = None,
    positions: int | None = None,
    **extra: Any,
) -> dict[str, Any]:
    """The keywords of a Llama-like transformers config: ``hidden`` and ``intermediate`` sizes,
    ``layers``, attention ``heads`` and ``kv_heads`` (default: ``heads``), then ``extra`` as given.
    ``vocab`` and ``positions`` (max_position_embeddings) are left to the config when None."""
    shape: dict[str, Any] = {} if vocab is None else {"vocab_size": vocab}
    shape.update(
        hidden_size=hidden,
        intermediate_size=intermediate,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=heads if kv_heads is None else kv_heads,
    )
    if positions is not None:
        shape["max_position_embeddings"] = positions
    return {**shape, **extra}


# The shape every tiny Llama-like test model starts from (families override what they lack).
TINY = llama_shape(64, 128, heads=4, kv_heads=2, vocab=512, positions=1024)


def mlp_expert(hidden: int) -> torch.nn.Module:
    """The expert of the tiny MoE test models: ``hidden -> 2 * hidden -> hidden`` with GELU."""
    return torch.nn.Sequential(
        torch.nn.Linear(hidden, 2 * hidden),
        torch.nn.GELU(),
        torch.nn.Linear(2 * hidden, hidden),
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
