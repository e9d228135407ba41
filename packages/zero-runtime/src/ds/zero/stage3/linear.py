"""``nn.Linear`` forward that lets stage 3 actually free released weights.

``F.linear`` saves ``weight.t()`` for backward: a view that pins the gathered weight's storage
until backward, so releasing the parameter after forward frees nothing. This function saves the
parameter itself instead; stage 3 gathers it again before the module's backward, which reads the
restored data.
"""

from __future__ import annotations

from typing import Any

import torch


class _Linear(torch.autograd.Function):
    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None
    ) -> torch.Tensor:
        ctx.save_for_backward(x, weight, bias)
        return torch.nn.functional.linear(x, weight, bias)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> Any:  # type: ignore[override]
        x, weight, bias = ctx.saved_tensors
        gx = gw = gb = None
        if ctx.needs_input_grad[0]:
            gx = grad.matmul(weight)
        g2 = grad.reshape(-1, grad.shape[-1])
        if ctx.needs_input_grad[1]:
            gw = g2.t().matmul(x.reshape(-1, x.shape[-1]))
        if bias is not None and ctx.needs_input_grad[2]:
            gb = g2.sum(0)
        return gx, gw, gb


def _forward(self: torch.nn.Linear, x: torch.Tensor) -> torch.Tensor:
    return _Linear.apply(x, self.weight, self.bias)  # type: ignore[no-any-return]


def patch_linears(module: torch.nn.Module) -> list[torch.nn.Linear]:
    """Route plain ``nn.Linear`` modules of ``module`` through :class:`_Linear`."""
    patched = []
    for m in module.modules():
        if type(m) is torch.nn.Linear and "forward" not in m.__dict__:
            m.forward = _forward.__get__(m)  # type: ignore[method-assign]
            patched.append(m)
    return patched


def unpatch_linears(patched: list[torch.nn.Linear]) -> None:
    for m in patched:
        m.__dict__.pop("forward", None)
