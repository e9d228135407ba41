"""``PipelineModule(topology=...)``: Megatron-DeepSpeed passes a ``PipeModelDataParallelTopology``
instead of ``num_stages``; the stage count is the topology's ``pipe`` axis."""

from __future__ import annotations

import torch

from ds.full.compat.deepspeed.pipe import PipelineModule
from ds.full.compat.deepspeed.runtime.pipe.topology import (
    PipeDataParallelTopology,
    PipeModelDataParallelTopology,
)


def _layers() -> list[torch.nn.Module]:
    return [torch.nn.Linear(4, 4) for _ in range(4)]


def test_stage_count_comes_from_the_pipe_axis() -> None:
    one = PipelineModule(layers=_layers(), topology=PipeModelDataParallelTopology(1, 2, 2))
    assert (one.num_stages, one.stage_id, one.parts) == (1, 0, [0, 4])
    x = torch.randn(2, 4)
    assert one(x).shape == (2, 4)
    two = PipelineModule(layers=_layers(), topology=PipeDataParallelTopology(num_pp=2, num_dp=1))
    assert two.num_stages == 2
    three = PipelineModule(layers=_layers(), topology=PipeModelDataParallelTopology(3, 1, 1))
    assert three.num_stages == 3
