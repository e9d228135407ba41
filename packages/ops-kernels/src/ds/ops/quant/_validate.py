"""Consistency checks of a QuantizedTensor before any implementation decodes it."""

from __future__ import annotations

import math

import torch

from ds.interfaces.errors import KernelError
from ds.interfaces.kernels import QuantizedTensor
from ds.ops.quant._schemes import (
    Scheme,
    bytes_per_group,
    check_group_size,
    get_scheme,
    num_groups,
)


def check_quantized(q: QuantizedTensor) -> Scheme:
    if not isinstance(q, QuantizedTensor):
        raise KernelError(f"dequantize expects a QuantizedTensor, got {type(q).__name__}")
    s = get_scheme(q.scheme)
    check_group_size(q.group_size)
    n = math.prod(q.shape)
    g = num_groups(n, q.group_size)
    want = g * bytes_per_group(s, q.group_size)
    if q.data.dtype != s.data_dtype:
        raise KernelError(
            f"{q.scheme} data must be {s.data_dtype}, got {q.data.dtype}; "
            "was it produced by ds.ops.quant.quantize with this scheme?"
        )
    if q.data.numel() != want:
        raise KernelError(
            f"{q.scheme} data has {q.data.numel()} elements but shape {q.shape} with "
            f"group_size {q.group_size} needs {want}"
        )
    if q.scales.dtype != torch.float32 or q.scales.numel() != g:
        raise KernelError(
            f"scales must be float32 with one value per group ({g}), "
            f"got {q.scales.dtype} with {q.scales.numel()}"
        )
    if s.asym:
        zp = q.zero_points
        if zp is None or zp.dtype != torch.float32 or zp.numel() != g:
            raise KernelError(
                f"{q.scheme} needs float32 zero_points with one value per group ({g}), got "
                f"{None if zp is None else (zp.dtype, zp.numel())}"
            )
    elif q.zero_points is not None:
        raise KernelError(f"{q.scheme} is symmetric and takes no zero_points; pass None")
    return s


def check_out(out: torch.Tensor, n: int, shape: tuple[int, ...], device: torch.device) -> None:
    """``out=`` of dequantize: float32, contiguous, ``n`` elements, on the data's device."""
    if not isinstance(out, torch.Tensor):
        raise KernelError(f"out must be a torch.Tensor, got {type(out).__name__}")
    if out.dtype != torch.float32 or not out.is_contiguous() or out.numel() != n:
        raise KernelError(
            f"out must be a contiguous float32 tensor of {n} elements (shape {shape}), got "
            f"{out.dtype} {tuple(out.shape)}{'' if out.is_contiguous() else ' non-contiguous'}"
        )
    if out.device != device:
        raise KernelError(f"out is on {out.device} but the quantized data is on {device}")
