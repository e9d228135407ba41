"""Stages 0-2: a ``loss.backward()`` the engine did not run is refused (it would bypass loss
scaling and gradient reduction); torch.func transforms through the engine still work."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from ds.zero.engine import ZeroEngine
from ds.zero.stages.reduction import DirectBackwardError


@pytest.mark.parametrize("stage", [0, 1, 2])
def test_direct_backward_is_refused(stage: int) -> None:
    model = nn.Sequential(nn.Linear(4, 3), nn.Tanh(), nn.Linear(3, 1))
    cfg = {
        "train_micro_batch_size_per_gpu": 1,
        "zero_allow_untested_optimizer": True,  # SGD
        "zero_optimization": {"stage": stage},
    }
    eng = ZeroEngine(model, cfg, optimizer=torch.optim.SGD(model.parameters(), lr=0.1))
    x = torch.randn(4)
    gx = torch.func.grad(lambda xi: eng(xi).sum())(x)  # gradients wrt the input only
    assert gx.shape == x.shape
    with pytest.raises(DirectBackwardError, match=r"engine\.backward"):
        eng(x).sum().backward()
    eng.backward(eng(x).sum())
    eng.step()
