"""``linear(x, q, bias)``: ``x @ dequantize(q).T + bias`` for a weight-only quantized linear layer.

For a few rows of float32 activations on the CPU (a decode step: one row per sequence) the native
kernel reads ``q``'s integer codes directly and never writes a float copy of the weight; a step
then reads a quarter (int8) or an eighth (int4) of the weight's fp32 bytes. Otherwise (many
rows, where a dense GEMM on a dequantized copy is faster; fp8; another device or dtype; rows not
made of whole groups; activations that need a gradient) it dequantizes and calls
``torch.nn.functional.linear``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ds.interfaces.kernels import QuantizedTensor
from ds.ops.quant._schemes import get_scheme

# Rows of x up to which the native kernel is used. Each block of 4 rows reads the codes once;
# past this a GEMM on the dequantized weight (read once, multiplied at GEMM speed) wins: on the
# SmolLM2-135M layers, one thread, AVX-512, int8 crossed over at about 13 rows and int4 past 16
# (tools/bench/quant_linear.py).
MAX_NATIVE_ROWS = 12


def native_applies(x: torch.Tensor, q: QuantizedTensor) -> bool:
    """Whether the native kernel computes ``linear(x, q)`` (see the module docstring)."""
    s = get_scheme(q.scheme)
    if x.requires_grad and torch.is_grad_enabled():
        return False  # the kernel has no backward; F.linear on the dequantized weight has
    if s.kind != "int" or len(q.shape) != 2 or x.dtype != torch.float32:
        return False
    if x.device.type != "cpu" or q.data.device.type != "cpu" or x.shape[-1] != q.shape[1]:
        return False
    k, gs = q.shape[1], q.group_size
    rows = x.numel() // max(1, k)
    return k % gs == 0 and (s.bits == 8 or gs % 2 == 0) and 0 < rows <= MAX_NATIVE_ROWS


def linear(
    x: torch.Tensor, q: QuantizedTensor, bias: torch.Tensor | None = None, *, impl: str = "auto"
) -> torch.Tensor:
    """``x @ W.T + bias`` with ``W = dequantize(q)`` (``q`` of shape ``(out, in)``); ``impl`` as
    for :func:`ds.ops.quant.dequantize` (``reference`` never uses the native kernel)."""
    if impl != "reference" and native_applies(x, q):
        from ds.ops._native import native

        s = get_scheme(q.scheme)
        n, k = q.shape
        flat = x.detach().reshape(-1, k).contiguous()
        y = torch.empty(flat.shape[0], n, dtype=torch.float32)
        data = q.data.contiguous().view(torch.uint8)
        scales = q.scales.contiguous()
        zps = q.zero_points.contiguous() if q.zero_points is not None else scales[:0]
        native().linear_int(
            flat, data, scales, zps, k, n, q.group_size, s.bits, s.asym, s.qmin, s.qmax, y
        )
        if bias is not None:
            y += bias
        return y.view(*x.shape[:-1], n)
    from ds.ops import quant

    w = quant.dequantize(q, x.dtype, impl=impl)  # type: ignore[arg-type]
    return F.linear(x, w, bias)
