"""Tiled compute (ds.parallel.sequence.tiled) under ZeRO 2 and 3 (ds.zero): the engines defer
reducing a parameter until its last slice, so the reduced gradients (read back whole with
``deepspeed.utils.safe_get_full_grad``) and the step equal the untiled model's."""

from __future__ import annotations

import copy

import pytest
import torch

import ds.zero
from ds.full.compat.deepspeed.utils import safe_get_full_grad
from ds.full.compat.deepspeed.utils.tensor_fragment import register_engine
from ds.parallel.sequence.tiled import TiledMLP
from ds.zero.engine import ZeroEngine


class _Net(torch.nn.Module):
    def __init__(self, tiled: bool) -> None:
        super().__init__()
        self.up, self.down, self.tiled = torch.nn.Linear(8, 24), torch.nn.Linear(24, 8), tiled

    def mlp(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(torch.relu(self.up(x)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        params = [self.up.weight, self.up.bias, self.down.weight, self.down.bias]
        y = TiledMLP.apply(type(self).mlp, self, x, 3, params) if self.tiled else self.mlp(x)
        return y.pow(2).mean()


@pytest.mark.parametrize("stage", [2, 3])
def test_tiled_step_equals_untiled(stage: int) -> None:
    torch.manual_seed(0)
    plain = _Net(tiled=False)
    tiled = copy.deepcopy(plain)
    tiled.tiled = True
    cfg = {
        "train_micro_batch_size_per_gpu": 2,
        "optimizer": {"type": "SGD", "params": {"lr": 0.5}},
        "zero_optimization": {"stage": stage, "reduce_bucket_size": 64},
    }
    ref = copy.deepcopy(plain)
    x = torch.randn(2, 10, 8, requires_grad=True)
    ref(x).backward()
    for model in (plain, tiled):
        engine = ZeroEngine(model, cfg)
        register_engine(engine)  # as deepspeed.initialize does
        engine.backward(engine(x))
        for p, r in zip(model.parameters(), ref.parameters()):
            torch.testing.assert_close(safe_get_full_grad(p), r.grad)
        engine.step()
    with ds.zero.GatheredParameters(list(plain.parameters()) + list(tiled.parameters())):
        for a, b in zip(plain.parameters(), tiled.parameters()):
            torch.testing.assert_close(a, b)
