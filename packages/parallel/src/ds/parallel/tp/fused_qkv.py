"""How the fused query/key/value projections of transformer blocks pack their sub-parameters,
recognised by the block's class name (the longest known name the class name contains wins:
``FalconDecoderLayer`` over ``DecoderLayer``).

Most layouts stack q, k and v along the output features, or keep each head's q, k and v
together (one block split contiguously), and are split per sub-parameter. CodeGen permutes its
rows in blocks across ranks and GPTBigCode gives every rank the whole key/value block: neither
is a per-sub-parameter split, so their parameters cannot be merged from slices.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

_KINDS = {
    "CodeGenBlock": "codegen",
    "BloomBlock": "bloom",
    "GLMBlock": "glm",
    "MPTBlock": "glm",
    "MptBlock": "glm",
    "BaichuanLayer": "glm",
    "QWenBlock": "qwen",
    "FalconDecoderLayer": "bloom",
    "GPTBigCodeBlock": "bigcode",
    "DecoderLayer": "glm",
    "Phi3DecoderLayer": "phi3",
}

#: why a layout without a per-sub-parameter split cannot be merged from its slices
NOT_PER_SUB_PARAM = (
    "its fused qkv layout interleaves or replicates blocks across tensor parallel ranks, so the "
    "original parameter cannot be reassembled from the shards"
)


def fused_kind(block: Any) -> str | None:
    """The packing of ``block``'s fused projection, or None for a block no layout names."""
    cls = type(block).__name__
    hits = [k for k in _KINDS if k in cls]
    return _KINDS[max(hits, key=len)] if hits else None


def fused_sub_param_sizes(
    kind: str | None,
    weight_shape: Sequence[int],
    num_kv_heads: int | None = None,
    n_embd: int | None = None,
    num_attention_heads: int | None = None,
) -> tuple[int, ...] | None:
    """The sub-parameter sizes along the output features of a fused weight packed as ``kind``
    (an unnamed block packs whole heads, one block); None for a layout that is not split per
    sub-parameter (see :data:`NOT_PER_SUB_PARAM`)."""
    total = int(weight_shape[0])
    if kind in (None, "bloom"):
        return (total,)
    if kind in ("glm", "qwen"):
        if num_kv_heads == 2 and n_embd is not None:
            kv = (total - n_embd) // 2
            return (n_embd, kv, kv)
        return (total // 3,) * 3
    if kind == "phi3":
        if not num_attention_heads or num_kv_heads is None:
            raise ValueError("a phi3 fused qkv weight needs the model's head counts")
        kv = num_kv_heads * (int(weight_shape[1]) // num_attention_heads)
        return (total - 2 * kv, kv, kv)
    return None


__all__ = ["NOT_PER_SUB_PARAM", "fused_kind", "fused_sub_param_sizes"]
