"""``deepspeed.runtime.pipe.module``: ``PipelineModule``, ``LayerSpec``, ``TiedLayerSpec``
(ds.parallel.pipeline's classes)."""

from ds.parallel.pipeline import LayerSpec, PipelineModule, TiedLayerSpec

__all__ = ["LayerSpec", "PipelineModule", "TiedLayerSpec"]
