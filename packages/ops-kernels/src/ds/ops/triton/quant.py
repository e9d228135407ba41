"""Group-wise quantization on GPUs with Triton (and on CPU through ``TRITON_INTERPRET=1``).

Same functions, format and results as :mod:`ds.ops.quant.reference`.
"""

from __future__ import annotations

import math
import os
from typing import Any

import torch

from ds.interfaces.errors import KernelError
from ds.interfaces.kernels import QuantizedTensor
from ds.ops.quant._schemes import (
    Scheme,
    bytes_per_group,
    check_quantize_args,
    num_groups,
)
from ds.ops.quant._validate import check_out, check_quantized
from ds.ops.triton._flat import on_device

# (mantissa bits, exponent bias, e4m3fn-style NaN encoding) per fp8 scheme.
_FP8 = {"fp8_e4m3": (3, 7, True), "fp8_e5m2": (2, 15, False)}


def _interpreted() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def _kernels() -> Any:
    try:
        from ds.ops.triton import quant_kernels
    except ImportError as e:
        raise KernelError(
            "Triton quantizers need the 'triton' package: pip install 'ds-ops-kernels[triton]' "
            "(or use impl='native' on CPU)"
        ) from e
    return quant_kernels


def _check_device(t: torch.Tensor) -> None:
    if t.device.type == "cpu" and not _interpreted():
        raise KernelError(
            "Triton quantizers run on GPU tensors; this one is on the CPU. Use impl='native' "
            "(or set TRITON_INTERPRET=1 to interpret the kernels on CPU)"
        )


def _launch_opts(t: torch.Tensor) -> dict[str, object]:
    # Fused multiply-add would change the rounding of x * inv + magic; keep IEEE mul then add.
    return {} if _interpreted() else {"enable_fp_fusion": False}


def _pow2(v: int) -> int:
    return 1 << max(0, (v - 1).bit_length())


# Elements per program: groups are batched into [ROWS, BLOCK] tiles of about this many elements,
# so that small groups still give every program enough work.
_TILE = 2048


def _rows(block: int) -> int:
    return max(1, _TILE // block)


def _grid(groups: int, rows: int) -> tuple[int]:
    return ((groups + rows - 1) // rows,)


def quantize(x: torch.Tensor, scheme: str, group_size: int) -> QuantizedTensor:
    # Triton launches on the current device; the tensor may live on another (a rank's own).
    with on_device(x):
        return _quantize(x, scheme, group_size)


def _quantize(x: torch.Tensor, scheme: str, group_size: int) -> QuantizedTensor:
    s = check_quantize_args(x, scheme, group_size)
    _check_device(x)
    k = _kernels()
    flat = x.detach().reshape(-1)
    if flat.dtype == torch.float64:
        flat = flat.to(torch.float32)
    flat = flat.contiguous()
    n = flat.numel()
    g = num_groups(n, group_size)
    dev = flat.device
    data = torch.empty(g * bytes_per_group(s, group_size), dtype=torch.uint8, device=dev)
    scales = torch.empty(g, dtype=torch.float32, device=dev)
    zps = torch.empty(g if s.asym else 1, dtype=torch.float32, device=dev)
    opts = _launch_opts(flat)
    block = _pow2(group_size)
    if s.kind == "int" and s.bits == 8:
        rows = _rows(block)
        k.quant_int8_kernel[_grid(g, rows)](
            flat, data, scales, zps, n, g, GS=group_size, BLOCK=block, ROWS=rows,
            ASYM=s.asym, QMIN=s.qmin, QMAX=s.qmax, **opts,
        )  # fmt: skip
    elif s.kind == "int":
        bpg = bytes_per_group(s, group_size)
        half = _pow2(bpg)
        rows = _rows(2 * half)
        k.quant_int4_kernel[_grid(g, rows)](
            flat, data, scales, zps, n, g, GS=group_size, BPG=bpg, HALF=half, ROWS=rows,
            ASYM=s.asym, QMIN=s.qmin, QMAX=s.qmax, BIAS=0 if s.asym else 8, **opts,
        )  # fmt: skip
    else:
        m, bias, _ = _FP8[scheme]
        emin = 1 - bias
        rows = _rows(block)
        k.quant_fp8_kernel[_grid(g, rows)](
            flat, data, scales, n, g, GS=group_size, BLOCK=block, ROWS=rows, FMAX=s.fp8_max,
            M=m, BIAS=bias, MAGIC_F=2.0 ** (emin - m + 23),
            MAGIC_BITS=(127 + emin - m + 23) << 23, MIN_NORMAL_BITS=(127 + emin) << 23, **opts,
        )  # fmt: skip
    return QuantizedTensor(
        data.view(s.data_dtype), scales, zps if s.asym else None, tuple(x.shape), group_size,
        scheme,
    )  # fmt: skip


def _dequant_launch(q: QuantizedTensor, s: Scheme, out: torch.Tensor, n: int) -> None:
    k = _kernels()
    g = num_groups(n, q.group_size)
    data = q.data.contiguous().view(torch.uint8)
    block = _pow2(q.group_size)
    rows = _rows(block)
    opts = _launch_opts(out)
    if s.kind == "int":
        zps = q.zero_points if q.zero_points is not None else q.scales
        k.dequant_int_kernel[_grid(g, rows)](
            data, q.scales.contiguous(), zps.contiguous(), out, n, g, GS=q.group_size,
            BPG=bytes_per_group(s, q.group_size), BLOCK=block, ROWS=rows, BITS=s.bits,
            ASYM=s.asym, **opts,
        )  # fmt: skip
    else:
        m, bias, fn = _FP8[q.scheme]
        k.dequant_fp8_kernel[_grid(g, rows)](
            data, q.scales.contiguous(), out, n, g, GS=q.group_size, BLOCK=block, ROWS=rows,
            M=m, BIAS=bias, FN=fn, SUB_STEP=2.0 ** (1 - bias - m), **opts,
        )  # fmt: skip


def dequantize(
    q: QuantizedTensor, dtype: torch.dtype | None = None, *, out: torch.Tensor | None = None
) -> torch.Tensor:
    s = check_quantized(q)
    _check_device(q.data)
    n = math.prod(q.shape)
    if out is None:
        out = torch.empty(n, dtype=torch.float32, device=q.data.device)
    else:
        check_out(out, n, q.shape, q.data.device)
    with on_device(out):
        _dequant_launch(q, s, out, n)
    out = out.view(q.shape)
    return out if dtype in (None, torch.float32) else out.to(dtype)
