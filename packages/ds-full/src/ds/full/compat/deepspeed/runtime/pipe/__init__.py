"""``deepspeed.runtime.pipe``: pipeline modules, topologies and schedules."""

from ds.full.compat.deepspeed.runtime.pipe import module, schedule, topology
from ds.full.compat.deepspeed.runtime.pipe.module import LayerSpec, PipelineModule, TiedLayerSpec
from ds.full.compat.deepspeed.runtime.pipe.topology import ProcessTopology

__all__ = [
    "LayerSpec", "PipelineModule", "ProcessTopology", "TiedLayerSpec", "module", "schedule",
    "topology",
]  # fmt: skip
