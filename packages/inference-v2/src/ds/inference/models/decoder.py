"""What every decoder-only family shares: the per-layer attention over the paged KV cache.

Construction is the same for every family: read the shape (``shape_keys``), let the family read
the rest of its config (``configure``: the other shape fields, ``windows`` (each layer's sliding
window or None), ``softcap``, ``rotary`` (None for learned positions)), take the token embedding
and let the family take its other weights (``load``), then refuse any weight nobody took. A
family implements ``layer`` and ``head`` (and ``embed`` where it adds to the token embedding);
``forward`` runs them over a ragged batch.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from ds.inference.attention import paged_attention, write_kv
from ds.inference.kv_cache import KVCache
from ds.inference.models.blocks import (
    DenseHead,
    LinearFactory,
    LinearFn,
    Weights,
    max_context,
    required,
)
from ds.inference.ragged import RaggedBatch
from ds.inference.rope import Rotary, apply_rotary
from ds.interfaces.errors import ConfigError

Tables = tuple[torch.Tensor, torch.Tensor] | None


def sliding_windows(
    config: dict[str, Any], num_layers: int, default: Callable[[int], bool] | None
) -> list[int | None]:
    """Each layer's sliding window, as transformers derives it.

    ``layer_types`` (saved by transformers 5) decides where present; otherwise ``default(i)``
    says whether layer ``i`` slides (the family's own rule for older config files), and with no
    rule every layer slides when ``sliding_window`` is set.
    """
    window = config.get("sliding_window")
    if not window:
        return [None] * num_layers
    window = int(window)
    types = config.get("layer_types")
    if types is not None:
        if len(types) != num_layers:
            raise ConfigError(
                f"layer_types has {len(types)} entries but num_hidden_layers={num_layers}"
            )
        return [window if t == "sliding_attention" else None for t in types]
    if default is None:
        return [window] * num_layers
    return [window if default(i) else None for i in range(num_layers)]


class RaggedDecoder:
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int
    dtype: torch.dtype
    max_context: int | None
    scale: float
    softcap: float | None = None
    alibi: torch.Tensor | None = None  # ALiBi slopes per head, for families without rope
    windows: list[int | None]
    rotary: Rotary | None

    # Config keys of the hidden size, head count, layer count and vocabulary ("a|b": either).
    shape_keys: tuple[str, ...] = (
        "hidden_size",
        "num_attention_heads",
        "num_hidden_layers",
        "vocab_size",
    )
    weight_prefixes: tuple[str, ...] = ("model.",)  # stripped from the checkpoint's names
    embed_name = "embed_tokens.weight"

    def __init__(
        self,
        config: dict[str, Any],
        weights: dict[str, torch.Tensor],
        dtype: torch.dtype,
        device: torch.device | str,
        linear_factory: LinearFactory | None = None,
    ) -> None:
        config, weights = self.convert(config, weights)
        self.dtype = dtype
        self.max_context = max_context(config)
        # Replaced by the Triton kernel when the engine is configured with attention="triton".
        self.attention: Callable[..., torch.Tensor] = paged_attention
        hidden, heads, layers, vocab = required(config, *self.shape_keys)
        self.hidden, self.num_heads = int(hidden), int(heads)
        self.num_layers, self.vocab_size = int(layers), int(vocab)
        self.configure(config, device)
        w = Weights(weights, self.weight_prefixes, dtype, device, linear_factory)
        self.embed_w = w.take(self.embed_name)
        self.load(w)
        w.finish()

    def tied_head(self, w: Weights, bias: torch.Tensor | None = None) -> LinearFn:
        """The checkpoint's ``lm_head.weight``, else the token embedding (tied); dense unless
        ``quantization.lm_head`` asked for it quantized (then a tied head is a quantized copy)."""
        head = w.maybe("lm_head.weight")
        weight = self.embed_w if head is None else head
        if getattr(w.make, "quantizes_head", False):
            return w.make(weight, bias)
        make_head = getattr(w.make, "make_head", None)  # a factory's own dense head (fp16 CPU)
        return make_head(weight, bias) if make_head is not None else DenseHead(weight, bias)

    @property
    def sliding_window(self) -> int | None:
        """The largest window of any layer (None when every layer attends to everything)."""
        ws = [w for w in self.windows if w is not None]
        return max(ws) if ws and len(ws) == len(self.windows) else None

    # -- family hooks -----------------------------------------------------------------------
    def convert(
        self, config: dict[str, Any], weights: dict[str, torch.Tensor]
    ) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
        """A config and checkpoint of another layout, renamed into the family's own."""
        return config, weights

    def configure(self, config: dict[str, Any], device: torch.device | str) -> None:
        """Everything the config decides beyond the shape (``scale``, ``windows``, ``rotary``)."""
        raise NotImplementedError

    def load(self, w: Weights) -> None:
        """Take every weight but the token embedding (``embed_w``)."""
        raise NotImplementedError

    def embed(self, batch: RaggedBatch) -> torch.Tensor:
        return self.embed_w[batch.token_ids]

    def layer(
        self, i: int, x: torch.Tensor, batch: RaggedBatch, cache: KVCache, rope: Tables
    ) -> torch.Tensor:
        raise NotImplementedError

    def head(self, x: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    # -- shared -----------------------------------------------------------------------------
    def rope_tables(self, batch: RaggedBatch, dtype: torch.dtype) -> Tables:
        if self.rotary is None:
            return None
        return self.rotary.cos_sin(batch.positions, dtype, list(batch.contexts), batch.token_seq)

    def attend(
        self,
        i: int,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        batch: RaggedBatch,
        cache: KVCache,
        rope: Tables,
        scale: float | None = None,
    ) -> torch.Tensor:
        """``q`` [T, heads, d], ``k``/``v`` [T, kv_heads, d] -> attention output [T, heads * d]."""
        if rope is not None:
            cos, sin = rope
            q = apply_rotary(q, cos, sin)
            k = apply_rotary(k, cos, sin)
        write_kv(cache.keys[i], cache.values[i], k, v, batch.slot_mapping)
        extra: dict[str, Any] = {}
        if self.windows[i] is not None:
            extra["window"] = self.windows[i]
        if self.softcap is not None:
            extra["softcap"] = self.softcap
        if self.alibi is not None:
            extra["alibi"] = self.alibi
        a = self.attention(
            q,
            cache.keys[i],
            cache.values[i],
            batch,
            self.scale if scale is None else scale,
            **extra,
        )
        return a.reshape(q.shape[0], self.num_heads * self.head_dim)

    def forward(self, batch: RaggedBatch, cache: KVCache) -> torch.Tensor:
        x = self.embed(batch)
        rope = self.rope_tables(batch, x.dtype)
        for i in range(self.num_layers):
            x = self.layer(i, x, batch, cache, rope)
        rows = batch.logit_rows if batch.logit_rows is not None else batch.query_start[1:] - 1
        return self.head(x[rows]).float()
