"""Tiny random transformers models from local configs (no download) for the TP tests."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import torch

# The ranks run as scripts: the suite's support folder is not on their path.
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "support"))
from tiny_models import llama_shape

VOCAB = 128


def config(kind: str, **overrides: Any) -> Any:
    import transformers as tf

    common: dict[str, Any] = {"vocab_size": VOCAB, "attn_implementation": "eager"}
    if kind == "gpt2":
        kw = dict(n_embd=32, n_layer=2, n_head=4, n_positions=64, bos_token_id=0, eos_token_id=0)
        kw.update(resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
        return tf.GPT2Config(**{**common, **kw, **overrides})
    cls = {
        "llama": tf.LlamaConfig,
        "qwen2": tf.Qwen2Config,
        "qwen3": tf.Qwen3Config,
        "mistral": tf.MistralConfig,
    }[kind]
    kw = llama_shape(32, 64, heads=4, kv_heads=2, positions=64, bos_token_id=0, eos_token_id=0)
    if kind == "qwen3":
        kw["head_dim"] = 8
    return cls(**{**common, **kw, **overrides})


PAD = 3  # "<kind>_pad" models use it as pad_token_id; every batch holds it


def model(kind: str, seed: int = 0, **overrides: Any) -> torch.nn.Module:
    import transformers as tf

    if kind.endswith("_pad"):
        kind, overrides = kind[: -len("_pad")], {"pad_token_id": PAD, **overrides}

    torch.manual_seed(seed)
    cfg = config(kind, **overrides)
    cls = tf.GPT2LMHeadModel if kind == "gpt2" else tf.AutoModelForCausalLM
    m = cls(cfg) if kind == "gpt2" else cls.from_config(cfg)
    return m.float().train()


def batch(step: int, size: int = 2, seq: int = 16) -> torch.Tensor:
    g = torch.Generator().manual_seed(1000 + step)
    ids = torch.randint(0, VOCAB, (size, seq), generator=g)
    ids[0, 1] = PAD
    return ids
