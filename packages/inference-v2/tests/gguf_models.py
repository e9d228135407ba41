"""Tiny GGUF files written with llama.cpp's ``gguf`` writer from tiny random transformers models:
llama.cpp's tensor names, its Q/K row permutation for llama, a byte-level BPE tokenizer with a
chat template, and each tensor in a chosen ggml type.

K-quant types (Q2_K..Q6_K) have no quantizer in the ``gguf`` package; their tensors are random
valid blocks (sane fp16 scales), so the reference for them is the file, not the original model.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch

from ds.inference.gguf_file import permute

CHATML = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content']"
    " + '<|im_end|>' + '\n' }}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|im_start|>assistant\n' }}{% endif %}"
)
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
MERGES = ["Ġ t", "h e", "Ġt he", "i n"]
# One of each supported type where shapes allow (row lengths 256/512 fit the 256-wide K blocks).
MIXED_TYPES = {
    "token_embd": "Q8_0",
    "attn_q": "Q4_0",
    "attn_k": "Q4_1",
    "attn_v": "Q4_K",
    "attn_output": "Q6_K",
    "ffn_gate": "F16",
    "ffn_up": "BF16",
    "ffn_down": "Q4_K",
    "output": "Q6_K",
}
# The other supported types (a second file).
MORE_TYPES = {
    "token_embd": "Q5_0",
    "attn_q": "Q5_1",
    "attn_k": "Q2_K",
    "attn_v": "Q3_K",
    "attn_output": "Q5_K",
    "ffn_gate": "Q5_K",
    "ffn_up": "Q3_K",
    "ffn_down": "Q2_K",
    "output": "Q5_0",
}
GGUF_TINY = dict(
    vocab_size=256 + len(MERGES) + len(SPECIALS),
    hidden_size=256,
    intermediate_size=512,
    max_position_embeddings=512,
)
_GGUF_NAMES = {
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
    "input_layernorm": "attn_norm",
    "post_attention_layernorm": "ffn_norm",
    "self_attn.q_norm": "attn_q_norm",
    "self_attn.k_norm": "attn_k_norm",
}
# Offsets of the fp16 scale fields inside one K-quant block.
_K_SCALES = {
    "Q2_K": ((80, 2e-3), (82, 2e-3)),
    "Q3_K": ((108, 2e-4),),
    "Q4_K": ((0, 2e-4), (2, 2e-4)),
    "Q5_K": ((0, 1e-4), (2, 1e-4)),
    "Q6_K": ((208, 2e-4),),
    "IQ4_NL": ((0, 1e-2),),  # a type ds refuses
}


def byte_tokens() -> list[str]:
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    return list(bytes_to_unicode().values())


def vocabulary() -> list[str]:
    return byte_tokens() + [m.replace(" ", "") for m in MERGES] + SPECIALS


def gguf_name(hf: str) -> str:
    if hf == "model.embed_tokens.weight":
        return "token_embd.weight"
    if hf == "model.norm.weight":
        return "output_norm.weight"
    if hf == "lm_head.weight":
        return "output.weight"
    parts = hf.split(".")  # model.layers.N.<module...>.weight|bias
    module = ".".join(parts[3:-1])
    return f"blk.{parts[2]}.{_GGUF_NAMES[module]}.{parts[-1]}"


def random_k_blocks(kind: str, rows: int, cols: int, seed: int) -> np.ndarray:
    """Random valid ``kind`` (a K-quant) data for a [rows, cols] tensor, as the byte array the
    writer takes."""
    import gguf

    qtype = gguf.GGMLQuantizationType[kind]
    block, size = gguf.GGML_QUANT_SIZES[qtype]
    rng = np.random.default_rng(seed)
    data = rng.integers(0, 256, size=(rows, cols // block, size), dtype=np.uint8)
    for offset, value in _K_SCALES[kind]:
        data[:, :, offset : offset + 2] = np.frombuffer(np.float16(value).tobytes(), np.uint8)
    return data.reshape(rows, cols // block * size)


def encode(array: np.ndarray, kind: str, seed: int) -> tuple[np.ndarray, Any]:
    """``(data, raw_dtype)`` of a float32 [rows, cols] array stored as ggml type ``kind``."""
    import gguf

    qtype = gguf.GGMLQuantizationType[kind]
    if kind == "F32":
        return array.astype(np.float32), None
    if kind == "F16":
        return array.astype(np.float16), None
    if kind in _K_SCALES:
        return random_k_blocks(kind, array.shape[0], array.shape[1], seed), qtype
    return gguf.quants.quantize(array.astype(np.float32), qtype), qtype


def write_gguf(
    path: Path,
    model: Any,
    arch: str = "llama",
    types: dict[str, str] | None = None,
    add_bos: bool | None = False,
    end_of_turn: bool = False,
) -> Path:
    """Write ``model`` (a transformers llama/qwen2) as llama.cpp would, each 2-D tensor in the
    ggml type ``types`` gives its llama.cpp short name (default F32; norms stay F32)."""
    import gguf

    cfg = model.config
    types = types or {}
    w = gguf.GGUFWriter(str(path), arch)
    w.add_name("tiny")
    w.add_block_count(cfg.num_hidden_layers)
    w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(cfg.hidden_size)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_head_count(cfg.num_attention_heads)
    w.add_head_count_kv(cfg.num_key_value_heads)
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    w.add_rope_freq_base(float(cfg.rope_parameters["rope_theta"]))
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    w.add_rope_dimension_count(head_dim)
    w.add_key_length(head_dim)
    w.add_value_length(head_dim)
    w.add_vocab_size(cfg.vocab_size)
    vocab = vocabulary()
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("smollm")
    w.add_token_list(vocab)
    w.add_token_types([1] * (len(vocab) - len(SPECIALS)) + [3] * len(SPECIALS))
    w.add_token_merges(MERGES)
    w.add_bos_token_id(vocab.index("<|im_start|>"))
    w.add_eos_token_id(vocab.index("<|im_end|>"))
    w.add_unk_token_id(vocab.index("<|endoftext|>"))
    if end_of_turn:
        w.add_eot_token_id(vocab.index("<|endoftext|>"))
    if add_bos is not None:
        w.add_add_bos_token(add_bos)
    w.add_chat_template(CHATML)
    heads = {"attn_q": cfg.num_attention_heads, "attn_k": cfg.num_key_value_heads}
    for seed, (name, tensor) in enumerate(model.state_dict().items()):
        if name == "lm_head.weight" and cfg.tie_word_embeddings:
            continue
        gname = gguf_name(name)
        short = gname.split(".")[-2]
        array = tensor.detach().float().numpy()
        if arch == "llama" and short in heads:
            array = permute(array, heads[short])
        kind = types.get(short, "F32") if array.ndim == 2 else "F32"
        data, raw = encode(array, kind, seed)
        w.add_tensor(gname, data, raw_dtype=raw)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def tiny_gguf_model(family: str = "llama", seed: int = 0) -> Any:
    from inference_models import make_model

    if family != "qwen3":
        return make_model(family, seed=seed, **GGUF_TINY)
    from tiny_models import tiny_model

    return tiny_model(
        "Qwen3Config",
        "Qwen3ForCausalLM",
        seed=seed,
        base=False,
        **GGUF_TINY,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
    )


def hf_from_gguf(path: Path) -> Any:
    """transformers' own GGUF loader's model of the file (float32)."""
    import transformers

    return transformers.AutoModelForCausalLM.from_pretrained(
        path.parent, gguf_file=path.name, dtype=torch.float32
    ).eval()
