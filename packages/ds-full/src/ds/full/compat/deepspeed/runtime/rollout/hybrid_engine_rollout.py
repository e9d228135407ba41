"""``deepspeed.runtime.rollout.hybrid_engine_rollout``: generate with the model the engine is
training (a transformers causal LM), no second copy of the weights and nothing to sync.

Generation runs the model's own ``generate`` inside ``ds.zero.generation``, which under ZeRO-3
gathers the parameters once for the call (not once per token) and switches the per-module
gathers off, so ranks may stop at different lengths. The responses' attention mask is rebuilt
from the tokens: a response ends at its first EOS, which it keeps; what follows is padding.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from ds.full.compat.deepspeed._missing import FeatureNotAvailableError
from ds.full.compat.deepspeed.runtime.rollout.base import (
    RolloutBatch,
    RolloutEngine,
    RolloutRequest,
    SamplingConfig,
)
from ds.zero.generation import generate as generate_gathered


@dataclass
class HybridEngineRolloutConfig:
    use_graph_capture: bool = False  # greedy decode replayed from a captured CUDA graph


class HybridEngineRollout(RolloutEngine):
    name = "hybrid_engine"

    def __init__(self, engine: Any, tokenizer: Any, cfg: Any = None) -> None:
        self.engine = engine
        self.tokenizer = tokenizer
        self.use_graph_capture = bool(getattr(cfg, "use_graph_capture", False))
        for option in ("use_shared_prefill", "enable_profiling", "align_decode_fronts"):
            if getattr(cfg, option, False):
                raise FeatureNotAvailableError(
                    f"HybridEngineRollout: {option} is not available in ds; leave it off"
                )

    def _pad_id(self) -> int:
        pad = self.tokenizer.pad_token_id
        pad = self.tokenizer.eos_token_id if pad is None else pad
        if pad is None:
            raise ValueError("the tokenizer must define pad_token_id or eos_token_id")
        return int(pad)

    @torch.no_grad()
    def generate(self, request: RolloutRequest, sampling: SamplingConfig) -> RolloutBatch:
        if sampling.continuous_batch_size is not None:
            raise FeatureNotAvailableError(
                "HybridEngineRollout: continuous batching is not available in ds; leave "
                "SamplingConfig.continuous_batch_size unset"
            )
        n = sampling.n_samples_per_prompt
        prompt_ids = request.prompt_ids.repeat_interleave(n, dim=0)
        prompt_mask = request.prompt_attention_mask.repeat_interleave(n, dim=0)
        prompt_len = prompt_ids.shape[1]
        pad = self._pad_id()
        module = self.engine.module
        greedy = sampling.temperature <= 0.0
        if self.use_graph_capture and greedy:
            out = self._generate_graph(
                prompt_ids, prompt_mask, sampling.max_new_tokens, pad, module, prompt_ids.device
            )
        else:
            kwargs: dict[str, Any] = {
                "attention_mask": prompt_mask,
                "max_new_tokens": sampling.max_new_tokens,
                "eos_token_id": self.tokenizer.eos_token_id,
                "pad_token_id": pad,
                "do_sample": not greedy,
            }
            if not greedy:
                kwargs.update(temperature=sampling.temperature, top_p=sampling.top_p)
                kwargs["top_k"] = max(sampling.top_k, 0)
            out = generate_gathered(module, prompt_ids, **kwargs)
        out, response_mask = self._pad_after_eos(out, prompt_len, self.tokenizer.eos_token_id, pad)
        mask = torch.cat([prompt_mask.to(response_mask.dtype), response_mask], dim=1)
        start = torch.full((out.shape[0],), prompt_len, dtype=torch.long, device=out.device)
        return RolloutBatch(input_ids=out, attention_mask=mask, response_start_idx=start)

    def _generate_graph(self, *args: Any) -> torch.Tensor:
        raise FeatureNotAvailableError(
            "HybridEngineRollout: decoding from a captured CUDA graph is not available in ds; "
            "set use_graph_capture=False"
        )

    @staticmethod
    def _pad_after_eos(
        ids: torch.Tensor, response_start: int, eos_token_id: Any, pad_token_id: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Keep each response's first EOS, pad what follows; return the ids and the responses'
        attention mask (1 on generated tokens up to and including that EOS)."""
        response = ids[:, response_start:]
        real = response != pad_token_id
        if eos_token_id is None or response.shape[1] == 0:
            return ids, real.long()
        eos = torch.as_tensor(eos_token_id, device=response.device, dtype=response.dtype)
        is_eos = torch.isin(response, eos.flatten())
        # Positions after the first EOS: at least one EOS strictly before them.
        after = (is_eos.long().cumsum(dim=1) - is_eos.long()) > 0
        first = is_eos & ~after
        ids = ids.clone()
        ids[:, response_start:] = response.masked_fill(after, pad_token_id)
        return ids, ((real | first) & ~after).long()

    @staticmethod
    def _sample_top_p(logits: torch.Tensor, temperature: float, top_p: float) -> torch.Tensor:
        """One token per row ``[B, 1]`` from ``softmax(logits / temperature)`` restricted to the
        smallest set of most likely tokens whose probability reaches ``top_p`` (nucleus)."""
        probs = torch.softmax(logits.float() / temperature, dim=-1)
        sorted_probs, order = probs.sort(dim=-1, descending=True)
        # A token stays when the tokens ranked above it have not yet reached top_p.
        drop = (sorted_probs.cumsum(dim=-1) - sorted_probs) >= top_p
        sorted_probs = sorted_probs.masked_fill(drop, 0.0)
        choice = torch.multinomial(sorted_probs / sorted_probs.sum(dim=-1, keepdim=True), 1)
        return order.gather(-1, choice)

    def sync_weights(self, step: int) -> None:
        """Nothing to do: generation reads the weights the engine trains."""
        return None


__all__ = ["HybridEngineRollout", "HybridEngineRolloutConfig"]
