"""``deepspeed.runtime.rollout``: on-policy generation for RL and distillation training, through
the ``RolloutEngine`` interface; :class:`HybridEngineRollout` generates with the trained model
itself."""

from __future__ import annotations

from typing import Any

from ds.full.compat.deepspeed.runtime.rollout.base import (
    RolloutBatch,
    RolloutConfig,
    RolloutEngine,
    RolloutRequest,
    SamplingConfig,
)
from ds.full.compat.deepspeed.runtime.rollout.hybrid_engine_rollout import HybridEngineRollout

ENGINES = ("hybrid_engine",)


def build_rollout(
    rollout_cfg: Any, student_engine: Any = None, tokenizer: Any = None, **kwargs: Any
) -> RolloutEngine:
    """The rollout engine ``rollout_cfg.engine`` names, for the engine training the student."""
    name = rollout_cfg.engine
    if name == "hybrid_engine":
        if student_engine is None or tokenizer is None:
            raise ValueError(
                "the hybrid_engine rollout needs both student_engine (the engine training the "
                "model) and tokenizer"
            )
        return HybridEngineRollout(student_engine, tokenizer, cfg=rollout_cfg)
    raise ValueError(f"Unknown rollout engine {name!r}; choose from {ENGINES}")


__all__ = [
    "HybridEngineRollout",
    "RolloutBatch",
    "RolloutConfig",
    "RolloutEngine",
    "RolloutRequest",
    "SamplingConfig",
    "build_rollout",
]
