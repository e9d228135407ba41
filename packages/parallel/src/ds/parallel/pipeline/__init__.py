"""Pipeline parallelism: ``PipelineModule`` of ``LayerSpec``/``TiedLayerSpec`` layers cut into
stages, GPipe / 1F1B / interleaved 1F1B schedules as instruction lists, and the runner that
executes one on a stage with p2p activation and gradient exchange (see docs/parallel.md)."""

from ds.parallel.pipeline.module import PipelineModule, check_stages
from ds.parallel.pipeline.partition import partition
from ds.parallel.pipeline.runner import PipelineRunner, StepTimes
from ds.parallel.pipeline.schedule import (
    SCHEDULES,
    Action,
    bubble_fraction,
    build,
    check_microbatches,
    forward_only,
    simulate,
)
from ds.parallel.pipeline.spec import LayerSpec, TiedLayerSpec
from ds.parallel.pipeline.tied import TiedWeights

__all__ = [
    "SCHEDULES",
    "Action",
    "LayerSpec",
    "PipelineModule",
    "PipelineRunner",
    "StepTimes",
    "TiedLayerSpec",
    "TiedWeights",
    "bubble_fraction",
    "build",
    "check_microbatches",
    "check_stages",
    "forward_only",
    "partition",
    "simulate",
]
