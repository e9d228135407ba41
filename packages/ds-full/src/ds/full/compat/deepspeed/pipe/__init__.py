"""``deepspeed.pipe``: pipeline parallelism, mapped to :mod:`ds.parallel.pipeline`.

``deepspeed.initialize(model=PipelineModule(...), config=...)`` returns ds's pipeline engine
(``train_batch`` / ``eval_batch``); the config's ``pipeline.schedule`` picks GPipe, 1F1B or
interleaved 1F1B."""

from __future__ import annotations

from ds.parallel.pipeline import LayerSpec, PipelineModule, TiedLayerSpec

__all__ = ["LayerSpec", "PipelineModule", "TiedLayerSpec"]
