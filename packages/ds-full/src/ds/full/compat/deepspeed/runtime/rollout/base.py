"""``deepspeed.runtime.rollout.base``: the contract between an RL / distillation trainer and the
engine that generates its on-policy samples: a request (left-padded prompts), sampling knobs, a
batch (prompt + response in one tensor) and the ``RolloutEngine`` interface."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

import torch


@dataclass
class RolloutConfig:
    engine: str = "hybrid_engine"
    use_graph_capture: bool = False


@dataclass
class SamplingConfig:
    """Per-``generate`` sampling; ``temperature <= 0`` is greedy, ``top_k <= 0`` no top-k."""

    max_new_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    n_samples_per_prompt: int = 1
    continuous_batch_size: int | None = None


def _check_pair(ids: torch.Tensor, mask: torch.Tensor, ids_name: str, mask_name: str) -> None:
    if ids.dim() != 2:
        raise ValueError(f"{ids_name} must be 2-D [batch, tokens]; got {tuple(ids.shape)}")
    if mask.shape != ids.shape:
        raise ValueError(
            f"{mask_name} shape {tuple(mask.shape)} does not match {ids_name} {tuple(ids.shape)}"
        )


@dataclass
class RolloutRequest:
    """Prompts, left-padded (real tokens at the right edge) so responses append after them."""

    prompt_ids: torch.Tensor  # [B, T_p]
    prompt_attention_mask: torch.Tensor  # [B, T_p], 1 on real prompt tokens

    def __post_init__(self) -> None:
        _check_pair(
            self.prompt_ids, self.prompt_attention_mask, "prompt_ids", "prompt_attention_mask"
        )


@dataclass
class RolloutBatch:
    """Prompt and response concatenated, ``B * n_samples_per_prompt`` rows; each row's response
    starts at ``response_start_idx``."""

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    response_start_idx: torch.Tensor

    def __post_init__(self) -> None:
        _check_pair(self.input_ids, self.attention_mask, "input_ids", "attention_mask")
        rows = self.input_ids.shape[0]
        if tuple(self.response_start_idx.shape) != (rows,):
            raise ValueError(
                f"response_start_idx must be 1-D of length {rows}; got "
                f"{tuple(self.response_start_idx.shape)}"
            )

    @property
    def batch_size(self) -> int:
        return int(self.input_ids.shape[0])

    @property
    def seq_len(self) -> int:
        return int(self.input_ids.shape[1])


class RolloutEngine(ABC):
    name: str = "base"

    @abstractmethod
    def generate(self, request: RolloutRequest, sampling: SamplingConfig) -> RolloutBatch:
        """Generate responses; return prompt + response in one batch."""

    @abstractmethod
    def sync_weights(self, step: int) -> None:
        """Bring the trainer's current weights into the generator (a no-op when it shares them)."""

    def shutdown(self) -> None:
        return None


__all__ = ["RolloutBatch", "RolloutConfig", "RolloutEngine", "RolloutRequest", "SamplingConfig"]
