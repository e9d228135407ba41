"""Pure-torch reference of group-wise quantization: the definition the native and Triton kernels
must reproduce bit for bit. All arithmetic is float32, rounding is round-half-to-even.

Integer schemes: ``scale = absmax / qmax`` (symmetric) or ``(max(x, 0) - min(x, 0)) / (qmax - qmin)``
(asymmetric, range widened to include 0 so that 0.0 and the padding are exact);
``inv = 1 / scale`` (0 when the group is all zeros; any other group's scale is at least the
smallest normal float32, so the inverse stays finite and tiny subnormals are not lost to an
underflowing division); ``zp = clamp(rint(-min * inv), 0, qmax)``;
``q = clamp(rint(x * inv) + zp, qmin, qmax)``; decoding is ``(q - zp) * scale``.
fp8 schemes: ``scale = absmax / fp8_max``, ``code = fp8(clamp(x * inv, -fp8_max, fp8_max))``,
decoding ``float(code) * scale``.
"""

from __future__ import annotations

import torch

from ds.interfaces.kernels import QuantizedTensor
from ds.ops.quant._schemes import (
    Scheme,
    bytes_per_group,
    check_quantize_args,
    num_groups,
)
from ds.ops.quant._validate import check_out, check_quantized


def _grouped(x: torch.Tensor, group_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Flat float32 groups (G, group_size) padded with 0, and a mask of the real elements."""
    flat = x.detach().reshape(-1).to(torch.float32)
    n = flat.numel()
    g = num_groups(n, group_size)
    padded = torch.zeros(g * group_size, dtype=torch.float32, device=flat.device)
    padded[:n] = flat
    mask = torch.zeros(g * group_size, dtype=torch.bool, device=flat.device)
    mask[:n] = True
    return padded.view(g, group_size), mask.view(g, group_size)


_FLT_MIN = torch.finfo(torch.float32).tiny


def _normal(scale: torch.Tensor, spread: torch.Tensor) -> torch.Tensor:
    """Give every group with a nonzero spread a scale of at least the smallest normal float32:
    1 / scale stays finite, and a group of tiny subnormals (spread / qmax underflows to 0) is not
    encoded as all zeros."""
    return torch.where(spread > 0, scale.clamp(min=_FLT_MIN), scale)


def _inverse(scale: torch.Tensor) -> torch.Tensor:
    one = torch.ones((), dtype=torch.float32, device=scale.device)
    return torch.where(scale > 0, one / torch.where(scale > 0, scale, one), torch.zeros_like(scale))


def _quantize_int(
    xg: torch.Tensor, mask: torch.Tensor, s: Scheme
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    if s.asym:
        hi = torch.where(mask, xg, torch.zeros_like(xg)).amax(dim=1).clamp(min=0.0)
        lo = torch.where(mask, xg, torch.zeros_like(xg)).amin(dim=1).clamp(max=0.0)
        r = float(s.qmax - s.qmin)
        spread = hi - lo
        # Finite values of opposite sign near the float32 maximum overflow hi - lo: divide first
        # there (only there, so every other group keeps the one-division rounding).
        overflow = spread.isinf() & hi.isfinite() & lo.isfinite()
        scale = _normal(torch.where(overflow, hi / r - lo / r, spread / r), spread)
        inv = _inverse(scale)
        zp = torch.round(-lo * inv).clamp(0, s.qmax)
    else:
        amax = xg.abs().amax(dim=1)
        scale = _normal(amax / float(s.qmax), amax)
        inv = _inverse(scale)
        zp = torch.zeros_like(scale)
    q = (torch.round(xg * inv[:, None]) + zp[:, None]).clamp(s.qmin, s.qmax)
    q = torch.where(mask, q, zp[:, None])  # padding encodes 0.0
    if s.bits == 8:
        data = q.to(s.data_dtype).reshape(-1)
    else:
        codes = (q if s.asym else q + 8).to(torch.uint8)
        if codes.shape[1] % 2:
            codes = torch.cat([codes, torch.zeros_like(codes[:, :1])], dim=1)
        data = (codes[:, 0::2] | (codes[:, 1::2] << 4)).reshape(-1)
    return data, scale, (zp if s.asym else None)


def _quantize_fp8(xg: torch.Tensor, s: Scheme) -> tuple[torch.Tensor, torch.Tensor, None]:
    amax = xg.abs().amax(dim=1)
    scale = _normal(amax / s.fp8_max, amax)
    inv = _inverse(scale)
    y = (xg * inv[:, None]).clamp(-s.fp8_max, s.fp8_max)
    return y.to(s.data_dtype).reshape(-1), scale, None


def quantize(x: torch.Tensor, scheme: str, group_size: int) -> QuantizedTensor:
    s = check_quantize_args(x, scheme, group_size)
    xg, mask = _grouped(x, group_size)
    if s.kind == "int":
        data, scale, zp = _quantize_int(xg, mask, s)
    else:
        data, scale, zp = _quantize_fp8(xg, s)
    return QuantizedTensor(data, scale, zp, tuple(x.shape), group_size, scheme)


def _codes(q: QuantizedTensor, s: Scheme, g: int) -> torch.Tensor:
    """Integer codes minus zero point, as float32 (G, group_size)."""
    if s.bits == 8:
        codes = q.data.view(g, q.group_size).to(torch.float32)
    else:
        packed = q.data.view(g, bytes_per_group(s, q.group_size))
        both = torch.stack([packed & 0xF, packed >> 4], dim=2).reshape(g, -1)
        codes = both[:, : q.group_size].to(torch.float32)
        if not s.asym:
            codes = codes - 8.0
    if s.asym:
        assert q.zero_points is not None
        codes = codes - q.zero_points[:, None]
    return codes


def dequantize(
    q: QuantizedTensor, dtype: torch.dtype | None = None, *, out: torch.Tensor | None = None
) -> torch.Tensor:
    s = check_quantized(q)
    n = 1
    for d in q.shape:
        n *= d
    if out is not None:
        check_out(out, n, q.shape, q.data.device)
    g = num_groups(n, q.group_size)
    if s.kind == "int":
        vals = _codes(q, s, g) * q.scales[:, None]
    else:
        vals = q.data.view(g, q.group_size).to(torch.float32) * q.scales[:, None]
    result = vals.reshape(-1)[:n].reshape(q.shape)
    if out is not None:
        result = out.view(q.shape).copy_(result)
    return result.to(dtype or torch.float32)
