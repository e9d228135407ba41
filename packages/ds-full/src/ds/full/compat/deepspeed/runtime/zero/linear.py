"""``deepspeed.runtime.zero.linear``: the linear autograd function stage 3 runs ``nn.Linear``
through (ds.zero.stage3.linear): it saves the weight parameter, not a view of its gathered data,
so stage 3 can free a released weight before backward; it works under torch.func transforms and
runs backward under the autocast state forward saw."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch

from ds.full.compat.deepspeed.accelerator import get_accelerator
from ds.zero.stage3.linear import LinearFunctionForZeroStage3, zero3_linear

# ``apply(input, weight, bias=None)``: torch.nn.functional.linear with ZeRO-3's saved tensors
# (ds.zero.stage3.linear.LinearFunctionForZeroStage3, the same class). zero3_linear_wrap is what
# stage 3 puts in place of F.linear under memory_efficient_linear.
zero3_linear_wrap = zero3_linear


class LinearModuleForZeroStage3(torch.nn.Linear):
    """``nn.Linear`` whose forward is :class:`LinearFunctionForZeroStage3`."""

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        return LinearFunctionForZeroStage3.apply(input, self.weight, self.bias)  # type: ignore[no-any-return]


def noop_decorator(func: Callable[..., Any]) -> Callable[..., Any]:
    return func


# torch.amp's custom_fwd/custom_bwd bound to the accelerator's device type (torch >= 2.4, which
# ds requires), for autograd functions written against DeepSpeed's names.
autocast_custom_fwd = functools.partial(
    torch.amp.custom_fwd, device_type=get_accelerator().device_name()
)
autocast_custom_bwd = functools.partial(
    torch.amp.custom_bwd, device_type=get_accelerator().device_name()
)

__all__ = [
    "LinearFunctionForZeroStage3",
    "LinearModuleForZeroStage3",
    "autocast_custom_bwd",
    "autocast_custom_fwd",
    "noop_decorator",
    "zero3_linear_wrap",
]
