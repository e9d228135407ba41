"""Gemma and Gemma 2: Llama's layout with ``1 + weight`` RMSNorm, embeddings scaled by
``sqrt(hidden_size)`` and a tanh-approximated GELU; Gemma 2 adds sandwich norms around attention
and MLP, attention and final logit softcapping, the ``query_pre_attn_scalar`` attention scale
and sliding-window attention on alternating layers.
"""

from __future__ import annotations

from typing import Any

import torch

from ds.inference.models.blocks import gemma_rms_norm, softcap
from ds.inference.models.llama import LlamaModel
from ds.inference.ragged import RaggedBatch


class GemmaModel(LlamaModel):
    norm = staticmethod(gemma_rms_norm)

    def configure(self, config: dict[str, Any], device: torch.device | str) -> None:
        super().configure(config, device)
        # transformers keeps the scale as an fp32 tensor and casts it to the weights' dtype.
        self.embed_scale = torch.tensor(self.hidden**0.5).to(self.dtype)
        scalar = config.get("query_pre_attn_scalar")
        if scalar is not None:
            self.scale = float(scalar) ** -0.5
        self.softcap = config.get("attn_logit_softcapping") or None
        self.final_softcap = config.get("final_logit_softcapping") or None

    def activation_name(self, config: dict[str, Any]) -> Any:
        name = config.get("hidden_activation") or config.get("hidden_act") or "gelu_pytorch_tanh"
        # Gemma's original configs say "gelu" but mean the tanh approximation (transformers too).
        return "gelu_pytorch_tanh" if name == "gelu" else name

    def embed(self, batch: RaggedBatch) -> torch.Tensor:
        return self.embed_w[batch.token_ids] * self.embed_scale

    def head(self, x: torch.Tensor) -> torch.Tensor:
        logits = super().head(x)
        if self.final_softcap is not None:
            logits = softcap(logits, float(self.final_softcap))
        return logits
