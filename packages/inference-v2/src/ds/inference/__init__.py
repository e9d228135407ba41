"""ds.inference: ragged-batching LLM inference engine with a blocked KV cache.

``build_engine(path_or_model, config)`` makes an engine (``put``/``query``/``flush``/``capacity``);
``generate(...)`` runs prompts to completion with continuous batching; ``ds serve`` serves an
OpenAI-compatible HTTP API.
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "ContinuousBatchScheduler",
    "EngineConfig",
    "GenerationResult",
    "InferenceEngineV2",
    "KVCacheConfig",
    "QuantizationConfig",
    "SamplingParams",
    "SchedulerConfig",
    "StateManagerConfig",
    "build_engine",
    "generate",
]

_WHERE = {
    "ContinuousBatchScheduler": "ds.inference.scheduler",
    "EngineConfig": "ds.inference.config",
    "KVCacheConfig": "ds.inference.config",
    "QuantizationConfig": "ds.inference.config",
    "SchedulerConfig": "ds.inference.config",
    "StateManagerConfig": "ds.inference.config",
    "GenerationResult": "ds.inference.generation",
    "generate": "ds.inference.generation",
    "InferenceEngineV2": "ds.inference.engine",
    "build_engine": "ds.inference.engine",
    "SamplingParams": "ds.interfaces.inference",
}


def __getattr__(name: str) -> Any:
    # Lazy: importing ds.inference must not pull in torch until something is used.
    if name in _WHERE:
        import importlib

        return getattr(importlib.import_module(_WHERE[name]), name)
    raise AttributeError(f"module 'ds.inference' has no attribute {name!r}")
