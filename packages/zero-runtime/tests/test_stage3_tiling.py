"""Tiled linear layers: the tiles hold the whole linear's slices and compute its output, also
when stage 3 partitions them."""

from __future__ import annotations

import pytest
import torch
from _stage3 import stage3

from ds.zero.stage3.tiling import TiledLinear, TiledLinearReturnBias, uniform_bounds


def test_uniform_bounds() -> None:
    assert uniform_bounds(10, 3) == [0, 4, 7, 10]
    assert uniform_bounds(2, 4) == [0, 1, 2, 2, 2]


@pytest.mark.parametrize("splits", [(1, 1), (3, 2), (5, 7)])
def test_tiles_compute_the_whole_linear(splits: tuple[int, int]) -> None:
    torch.manual_seed(0)
    base = torch.nn.Linear(23, 29)
    tiled = TiledLinear(23, 29, in_splits=splits[0], out_splits=splits[1], init_linear=base)
    x = torch.randn(4, 23)
    torch.testing.assert_close(tiled(x), base(x))
    with pytest.raises(RuntimeError):
        TiledLinear(4, 4, in_splits=5)


class _WithBias(torch.nn.Linear):
    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:  # type: ignore[override]
        return torch.nn.functional.linear(x, self.weight), self.bias


def test_return_bias_tiles_keep_the_bias_apart() -> None:
    base = torch.nn.Linear(6, 4)
    tiled = TiledLinearReturnBias(6, 4, in_splits=2, out_splits=2, linear_cls=_WithBias)
    tiled.copy_params_from(base)
    x = torch.randn(3, 6)
    out, bias = tiled(x)
    torch.testing.assert_close(out, x @ base.weight.t())
    torch.testing.assert_close(bias, base.bias)


def test_tiles_under_stage3() -> None:
    torch.manual_seed(0)
    base = torch.nn.Linear(8, 6)
    model = TiledLinear(8, 6, in_splits=2, out_splits=3, init_linear=base)
    x = torch.randn(2, 8)
    want = base(x)
    stage3(model, torch.optim.SGD(model.parameters(), lr=0.0), stage3_param_persistence_threshold=0)
    assert model.linears[0][0].weight.numel() == 0  # partitioned
    torch.testing.assert_close(model(x), want)


def test_return_bias_tiles_under_stage3() -> None:
    torch.manual_seed(0)
    base = torch.nn.Linear(6, 4)
    model = TiledLinearReturnBias(6, 4, in_splits=2, out_splits=2, linear_cls=_WithBias)
    model.copy_params_from(base)
    x = torch.randn(3, 6)
    stage3(model, torch.optim.SGD(model.parameters(), lr=0.0), stage3_param_persistence_threshold=0)
    out, bias = model(x)  # each tile hands its bias back to the tiled layer
    torch.testing.assert_close(out, x @ base.weight.t())
    torch.testing.assert_close(bias, base.bias)
