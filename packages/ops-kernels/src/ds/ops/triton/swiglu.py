"""Fused SwiGLU, ``silu(a) * b``, as a Triton kernel with a Triton backward (autograd-aware).

GPU tensors run the compiled kernels; on CPU they run under ``TRITON_INTERPRET=1`` (tests).
The pure-torch definition is :mod:`ds.ops.triton.swiglu_reference`.
"""

from __future__ import annotations

import os
from typing import Any

import torch

from ds.interfaces.errors import KernelError
from ds.ops.triton._flat import on_device

_BLOCK = 1024
_DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64)


def _kernels() -> Any:
    try:
        from ds.ops.triton import swiglu_kernels
    except ImportError as e:
        raise KernelError(
            "fused SwiGLU needs the 'triton' package (pip install 'ds-ops-kernels[triton]'); "
            "ds.ops.triton.swiglu_reference.swiglu is the pure-torch equivalent"
        ) from e
    return swiglu_kernels


def _check(a: torch.Tensor, b: torch.Tensor) -> None:
    if not isinstance(a, torch.Tensor) or not isinstance(b, torch.Tensor):
        raise KernelError("swiglu expects two tensors a and b")
    if a.shape != b.shape:
        raise KernelError(
            f"swiglu needs a and b of the same shape, got {tuple(a.shape)} and {tuple(b.shape)}; "
            "for a packed [..., 2H] input use swiglu(*x.chunk(2, dim=-1))"
        )
    if a.dtype not in _DTYPES or b.dtype != a.dtype:
        raise KernelError(
            f"swiglu needs floating-point a and b of one dtype, got {a.dtype} and {b.dtype}"
        )
    if a.device != b.device:
        raise KernelError(f"a is on {a.device} but b is on {b.device}")
    if a.device.type == "cpu" and os.environ.get("TRITON_INTERPRET", "0") != "1":
        raise KernelError(
            "fused SwiGLU runs on GPU tensors; on CPU use ds.ops.triton.swiglu_reference.swiglu "
            "(or set TRITON_INTERPRET=1 to interpret the kernel)"
        )


def _grid(n: int) -> tuple[int]:
    return ((n + _BLOCK - 1) // _BLOCK,)


class _SwiGLU(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        a_c, b_c = a.contiguous(), b.contiguous()
        out = torch.empty_like(a_c)
        n = a_c.numel()
        if n:
            with on_device(out):  # launch on the tensors' device, not the current one
                _kernels().swiglu_fwd_kernel[_grid(n)](a_c, b_c, out, n, BLOCK=_BLOCK)
        ctx.save_for_backward(a_c, b_c)
        return out

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        a, b = ctx.saved_tensors
        g = grad.contiguous()
        da, db = torch.empty_like(a), torch.empty_like(b)
        n = a.numel()
        if n:
            with on_device(da):
                _kernels().swiglu_bwd_kernel[_grid(n)](g, a, b, da, db, n, BLOCK=_BLOCK)
        return da, db


def swiglu(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``silu(a) * b`` in one pass (forward and backward), in a's dtype and shape."""
    _check(a, b)
    out: torch.Tensor = _SwiGLU.apply(a, b)  # type: ignore[no-untyped-call]
    return out
