"""``zero_optimization.ignore_unused_parameters: false``: a trainable parameter that gets no
gradient in an accumulation window is an error at its boundary (stages 1-2); the default trains
on."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from ds.zero.engine import ZeroEngine
from ds.zero.stages.reduction import UnusedParametersError


class HalfUsed(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.used = nn.Linear(4, 4)
        self.unused = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.used(x).sum()


def _engine(model: nn.Module, stage: int, ignore: bool) -> ZeroEngine:
    cfg = {
        "train_micro_batch_size_per_gpu": 1,
        "gradient_accumulation_steps": 2,
        "zero_allow_untested_optimizer": True,  # SGD
        "zero_optimization": {"stage": stage, "ignore_unused_parameters": ignore},
    }
    return ZeroEngine(model, cfg, optimizer=torch.optim.SGD(model.parameters(), lr=0.1))


@pytest.mark.parametrize("stage", [1, 2])
def test_unused_parameter_is_an_error_only_when_asked(stage: int) -> None:
    x = torch.randn(1, 4)
    eng = _engine(HalfUsed(), stage, ignore=False)
    eng.backward(eng(x))  # not a boundary yet
    eng.step()
    with pytest.raises(UnusedParametersError, match="ignore_unused_parameters"):
        eng.backward(eng(x))
    frozen = HalfUsed()
    frozen.unused.requires_grad_(False)
    eng = _engine(frozen, stage, ignore=False)
    for _ in range(2):
        eng.backward(eng(x))
        eng.step()
    eng = _engine(HalfUsed(), stage, ignore=True)
    for _ in range(2):
        eng.backward(eng(x))
        eng.step()
