"""``nn.Linear`` forward that lets stage 3 actually free released weights.

``F.linear`` saves ``weight.t()`` for backward: a view that pins the gathered weight's storage
until backward, so releasing the parameter after forward frees nothing. This function saves the
parameter itself instead; stage 3 gathers it again before the module's backward, which reads the
restored data.

With an allocator (stage 3 passes its buffer pool's ``take``), the weight gradient is computed
straight into a pooled buffer: autograd adopts it as ``param.grad``, the reduce-scatter reads it
and the buffer returns to the pool afterwards, so the largest per-step gradient transients never
touch the C heap.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

Alloc = Callable[[int, torch.dtype, torch.device], torch.Tensor]

#: torch's own ``F.linear``, taken when ds.zero first loads: what :func:`zero3_linear` falls back
#: to and what :class:`LinearFunctionForZeroStage3` computes with, whatever ``torch.nn.functional.linear`` is later.
TORCH_LINEAR = torch.nn.functional.linear


class LinearFunctionForZeroStage3(torch.autograd.Function):
    """``F.linear`` that saves its weight parameter for backward (DeepSpeed's name)."""

    # forward/setup_context split and a generated vmap rule: torch.func transforms (grad, vmap,
    # jacrev) can run through it.
    generate_vmap_rule = True

    @staticmethod
    def forward(  # type: ignore[override]
        x: torch.Tensor,
        weight: torch.Tensor,
        bias: torch.Tensor | None = None,
        alloc: Alloc | None = None,
    ) -> torch.Tensor:
        return TORCH_LINEAR(x, weight, bias)

    @staticmethod
    def setup_context(ctx: Any, inputs: tuple[Any, ...], output: torch.Tensor) -> None:
        x, weight, bias, alloc = (*inputs, None, None)[:4]
        ctx.save_for_backward(x, weight, bias)
        ctx.alloc = alloc
        # Backward runs under the autocast state forward saw (and only that one): an autocast
        # forward made ``grad`` half precision while the saved tensors are fp32.
        device = x.device.type
        ctx._fwd_used_autocast = torch.is_autocast_enabled(device)
        ctx._dtype = torch.get_autocast_dtype(device)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> Any:  # type: ignore[override]
        with torch.autocast(grad.device.type, ctx._dtype, enabled=ctx._fwd_used_autocast):
            return LinearFunctionForZeroStage3._grads(ctx, grad)

    @staticmethod
    def _grads(ctx: Any, grad: torch.Tensor) -> Any:
        x, weight, bias = ctx.saved_tensors
        gx = gw = gb = None
        if ctx.needs_input_grad[0]:
            gx = grad.matmul(weight)
        g2 = grad.reshape(-1, grad.shape[-1])
        if ctx.needs_input_grad[1]:
            x2 = x.reshape(-1, x.shape[-1])
            if ctx.alloc is None or x2.dtype != grad.dtype or ctx._fwd_used_autocast:
                gw = g2.t().matmul(x2)
            else:
                buf = ctx.alloc(weight.numel(), grad.dtype, grad.device)
                gw = torch.mm(g2.t(), x2, out=buf.view(weight.shape))
        if bias is not None and ctx.needs_input_grad[2]:
            gb = g2.sum(0)
        return gx, gw, gb, None


def zero3_linear(
    input: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None
) -> torch.Tensor:
    """``F.linear`` for stage 3 (``memory_efficient_linear``; DeepSpeed's ``zero3_linear_wrap``):
    whatever a backward will need goes through :class:`LinearFunctionForZeroStage3`, so a module
    calling ``F.linear`` on a partitioned weight does not pin its gathered data until backward
    either; without autograd it is torch's own linear."""
    needs_grad = input.requires_grad or weight.requires_grad
    needs_grad = needs_grad or (bias is not None and bias.requires_grad)
    if needs_grad and torch.is_grad_enabled():
        return LinearFunctionForZeroStage3.apply(input, weight, bias)  # type: ignore[no-any-return]
    return TORCH_LINEAR(input, weight, bias)


def _forward(self: torch.nn.Linear, x: torch.Tensor) -> torch.Tensor:
    alloc = self.__dict__.get("_ds_grad_alloc")
    return LinearFunctionForZeroStage3.apply(x, self.weight, self.bias, alloc)  # type: ignore[no-any-return]


def patch_linears(module: torch.nn.Module, alloc: Alloc | None = None) -> list[torch.nn.Linear]:
    """Route plain ``nn.Linear`` modules of ``module`` through :class:`LinearFunctionForZeroStage3`; weight
    gradients come from ``alloc`` when given."""
    patched = []
    for m in module.modules():
        if type(m) is torch.nn.Linear and "forward" not in m.__dict__:
            m.forward = _forward.__get__(m)  # type: ignore[method-assign]
            m.__dict__["_ds_grad_alloc"] = alloc
            patched.append(m)
    return patched


def unpatch_linears(patched: list[torch.nn.Linear]) -> None:
    for m in patched:
        m.__dict__.pop("forward", None)
        m.__dict__.pop("_ds_grad_alloc", None)
