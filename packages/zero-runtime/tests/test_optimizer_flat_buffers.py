"""At stages 1-2 the engine's optimizer names each group's flat parameter buffer
(``bit16_groups_flat``, DeepSpeed's name): the buffer the parameters are views into."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from ds.zero.engine import ZeroEngine


@pytest.mark.parametrize("stage", [1, 2])
def test_flat_buffers_hold_the_parameters(stage: int) -> None:
    model = nn.Sequential(nn.Linear(4, 3), nn.Linear(3, 2))
    cfg = {
        "train_micro_batch_size_per_gpu": 1,
        "zero_allow_untested_optimizer": True,  # SGD
        "zero_optimization": {"stage": stage},
    }
    eng = ZeroEngine(model, cfg, optimizer=torch.optim.SGD(model.parameters(), lr=0.1))
    (flat,) = eng.optimizer.bit16_groups_flat
    assert flat.grad_fn is None
    start, stop = flat.data_ptr(), flat.data_ptr() + flat.numel() * flat.element_size()
    assert all(start <= p.data_ptr() < stop for p in model.parameters())
