"""``deepspeed.runtime.pipe.engine.PipelineEngine``: ds's pipeline engine."""

from ds.full.pipeline import PipelineEngine

__all__ = ["PipelineEngine"]
