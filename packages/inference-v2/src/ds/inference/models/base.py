"""What the engine needs from a model family."""

from __future__ import annotations

from typing import Any, Protocol

import torch

from ds.inference.kv_cache import KVCache
from ds.inference.ragged import RaggedBatch


class RaggedModel(Protocol):
    num_layers: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int
    dtype: torch.dtype
    # Longest sequence the model serves, from its config (None: the config does not say).
    max_context: int | None
    # Each layer's sliding window (None: that layer attends to its whole context).
    windows: list[int | None]

    def forward(self, batch: RaggedBatch, cache: KVCache) -> torch.Tensor:
        """Write the batch's KV into ``cache`` and return logits (fp32) of the rows
        ``batch.logit_rows`` names; when it is None, each sequence's last token [S, vocab]."""
        ...


class ModelFamily(Protocol):
    """Registered under ``ds.inference_models`` by ``model_type`` (the key in config.json)."""

    def __call__(
        self,
        config: dict[str, Any],
        weights: dict[str, torch.Tensor],
        dtype: torch.dtype,
        device: torch.device | str,
        linear_factory: Any = None,
    ) -> RaggedModel: ...
