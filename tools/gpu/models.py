"""Llama-shaped models for the GPU check, built with transformers from a config (no downloads),
and the FLOP count MFU is computed from."""

from __future__ import annotations

from typing import Any

import torch

_SHAPE_KEYS = (
    "vocab_size",
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "max_position_embeddings",
)


def llama_shape(
    hidden: int,
    intermediate: int,
    *,
    layers: int,
    heads: int,
    kv_heads: int,
    vocab: int,
    positions: int,
) -> dict[str, int]:
    """The LlamaConfig keywords of one shape."""
    sizes = (vocab, hidden, intermediate, layers, heads, kv_heads, positions)
    return dict(zip(_SHAPE_KEYS, sizes))


# "1b": hidden 2048, 18 layers, 32k vocabulary (1.06e9 parameters); "tiny": the CPU test's.
SIZES: dict[str, dict[str, int]] = {
    "1b": llama_shape(2048, 5632, layers=18, heads=16, kv_heads=16, vocab=32000, positions=4096),
    "tiny": llama_shape(64, 128, layers=2, heads=4, kv_heads=2, vocab=512, positions=1024),
}

# Dense bf16 peak of common accelerators in TFLOP/s (vendor figures, no sparsity).
PEAK_TFLOPS = {"H200": 989.4, "H100": 989.4, "H800": 989.4, "A100": 312.0, "L40S": 362.1}


def llama_config(size: str) -> Any:
    import transformers

    if size not in SIZES:
        raise ValueError(f"model size {size!r}: choose one of {', '.join(SIZES)}")
    return transformers.LlamaConfig(**SIZES[size], attn_implementation="sdpa")


def param_count(size: str) -> int:
    """Parameters of the Llama of ``size``, from its shape (embeddings and head untied)."""
    c = SIZES[size]
    d, f, layers, v = (
        c["hidden_size"],
        c["intermediate_size"],
        c["num_hidden_layers"],
        c["vocab_size"],
    )
    kv = d * c["num_key_value_heads"] // c["num_attention_heads"]
    per_layer = 2 * d * d + 2 * d * kv + 3 * d * f + 2 * d  # q, o, k, v, MLP, two norms
    return 2 * v * d + layers * per_layer + d  # embeddings, head, layers, final norm


def build_llama(size: str, seed: int = 0) -> torch.nn.Module:
    """A randomly initialised LlamaForCausalLM on the CPU, fp32."""
    import transformers

    torch.manual_seed(seed)
    return transformers.LlamaForCausalLM(llama_config(size))


def flops_per_token(size: str, seq: int) -> float:
    """Training FLOPs per token: 6 per matmul weight (forward and backward) plus attention's
    12 * layers * hidden * seq (PaLM's count); the embedding lookup is not a matmul."""
    c = SIZES[size]
    matmul_params = param_count(size) - c["vocab_size"] * c["hidden_size"]
    return 6.0 * matmul_params + 12.0 * c["num_hidden_layers"] * c["hidden_size"] * seq


def peak_tflops(device_name: str, override: float | None) -> float | None:
    if override is not None:
        return override
    for key, value in PEAK_TFLOPS.items():
        if key in device_name:
            return value
    return None
