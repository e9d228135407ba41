"""Llama-shaped models for the GPU check, built with transformers from a config (no downloads),
and the FLOP count MFU is computed from."""

from __future__ import annotations

from typing import Any

import torch

# "1b": hidden 2048, 18 layers, 32k vocabulary (1.06e9 parameters); "tiny": the CPU test's.
SIZES: dict[str, dict[str, int]] = {
    "1b": dict(
        vocab_size=32000,
        hidden_size=2048,
        intermediate_size=5632,
        num_hidden_layers=18,
        num_attention_heads=16,
        num_key_value_heads=16,
        max_position_embeddings=4096,
    ),
    "tiny": dict(
        vocab_size=512,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=1024,
    ),
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
