"""CPU native quantization (C++ kernels in ds.ops._C), bit-identical to the reference."""

from __future__ import annotations

import math

import torch

from ds.interfaces.errors import KernelError
from ds.interfaces.kernels import QuantizedTensor
from ds.ops._native import native
from ds.ops.quant._schemes import (
    bytes_per_group,
    check_quantize_args,
    num_groups,
)
from ds.ops.quant._validate import check_out, check_quantized

_NATIVE_INPUTS = (torch.float32, torch.float16, torch.bfloat16)


def _require_cpu(t: torch.Tensor, what: str) -> None:
    if t.device.type != "cpu":
        raise KernelError(
            f"native quantization runs on CPU tensors, {what} is on {t.device}; "
            "use impl='triton' for GPU tensors or move it with .cpu()"
        )


def quantize(x: torch.Tensor, scheme: str, group_size: int) -> QuantizedTensor:
    s = check_quantize_args(x, scheme, group_size)
    _require_cpu(x, "the input")
    flat = x.detach().reshape(-1)
    if flat.dtype not in _NATIVE_INPUTS:
        flat = flat.to(torch.float32)
    flat = flat.contiguous()
    n = flat.numel()
    g = num_groups(n, group_size)
    data = torch.empty(g * bytes_per_group(s, group_size), dtype=torch.uint8)
    scales = torch.empty(g, dtype=torch.float32)
    lib = native()
    if s.kind == "int":
        zps = torch.empty(g if s.asym else 0, dtype=torch.float32)
        lib.quant_int(flat, group_size, s.bits, s.asym, s.qmin, s.qmax, data, scales, zps)
        return QuantizedTensor(
            data.view(s.data_dtype),
            scales,
            zps if s.asym else None,
            tuple(x.shape),
            group_size,
            scheme,
        )
    e_bits = 4 if scheme == "fp8_e4m3" else 5
    lib.quant_fp8(flat, group_size, e_bits, data, scales)
    return QuantizedTensor(
        data.view(s.data_dtype), scales, None, tuple(x.shape), group_size, scheme
    )


def dequantize(
    q: QuantizedTensor, dtype: torch.dtype | None = None, *, out: torch.Tensor | None = None
) -> torch.Tensor:
    s = check_quantized(q)
    for t, what in ((q.data, "data"), (q.scales, "scales")):
        _require_cpu(t, what)
    n = math.prod(q.shape)
    if out is None:
        out = torch.empty(n, dtype=torch.float32)
    else:
        check_out(out, n, q.shape, q.data.device)
    given = out
    out = out.view(-1)
    data = q.data.contiguous().view(torch.uint8)
    scales = q.scales.contiguous()
    lib = native()
    if s.kind == "int":
        zps = q.zero_points.contiguous() if q.zero_points is not None else scales[:0]
        lib.dequant_int(data, scales, zps, q.group_size, s.bits, s.asym, s.qmin, s.qmax, out)
    else:
        lib.dequant_fp8(data, scales, q.group_size, 4 if q.scheme == "fp8_e4m3" else 5, out)
    out = given.view(q.shape)
    return out if dtype in (None, torch.float32) else out.to(dtype)
