"""The blocked KV cache tensors: per layer, keys and values of shape [kv_heads, blocks, block_size, dim].

Head-major so that gathering a sequence's blocks yields [kv_heads, tokens, dim] directly, the
layout attention multiplies in, with no transposing copy.
"""

from __future__ import annotations

import torch

from ds.inference.config import KVCacheConfig
from ds.interfaces.errors import InferenceError


def bytes_per_block(
    layers: int, kv_heads: int, head_dim: int, block_size: int, dtype: torch.dtype
) -> int:
    itemsize = torch.empty((), dtype=dtype).element_size()
    return 2 * layers * block_size * kv_heads * head_dim * itemsize


def resolve_num_blocks(
    config: KVCacheConfig,
    per_block: int,
    default_tokens: int,
) -> int:
    if config.num_blocks is not None:
        return config.num_blocks
    if config.memory_budget_bytes is not None:
        n = config.memory_budget_bytes // per_block
        if n < 1:
            raise InferenceError(
                f"kv_cache.memory_budget_bytes={config.memory_budget_bytes} holds no block "
                f"(one block needs {per_block} bytes); raise the budget or lower block_size"
            )
        return n
    return -(-default_tokens // config.block_size)


class KVCache:
    def __init__(
        self,
        layers: int,
        num_blocks: int,
        block_size: int,
        kv_heads: int,
        head_dim: int,
        dtype: torch.dtype,
        device: torch.device | str,
    ) -> None:
        self.num_blocks = num_blocks
        self.block_size = block_size
        shape = (kv_heads, num_blocks, block_size, head_dim)
        self.keys = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(layers)]
        self.values = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(layers)]

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.keys + self.values)
