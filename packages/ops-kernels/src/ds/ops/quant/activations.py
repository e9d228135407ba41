"""Activations quantized to int8 per block, for ``linear(..., activations="int8")``.

A row of ``x`` is cut into blocks of the weight's group size; each block gets the scale
``max|x| / 127`` and the codes ``round(x * (127 / max|x|))`` (fp32 product, ties to even), so a
group of the weight meets one block and its contribution to the output is an exact integer dot
product of codes times the two scales. This module is the torch form, on any device and dtype;
the native kernel (ds.ops._C ``QLinearWeight.run(..., int8_x=True)``) computes the same codes.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ds.interfaces.errors import ConfigError
from ds.interfaces.kernels import QuantizedTensor
from ds.ops.quant._schemes import get_scheme

SCHEMES = ("int8_sym", "int4_sym")


def check_weight(q: QuantizedTensor) -> None:
    """Refuses weights whose groups the int8 activation blocks cannot follow."""
    if q.scheme not in SCHEMES or get_scheme(q.scheme).asym:
        raise ConfigError(
            f"int8 activations need a symmetric integer weight scheme ({', '.join(SCHEMES)}), "
            f"got {q.scheme!r}; quantize the weight with one of them or use activations='float'"
        )
    if len(q.shape) != 2 or q.shape[1] % q.group_size != 0:
        raise ConfigError(
            f"int8 activations are quantized per weight group: the weight's rows ({q.shape}) "
            f"must be whole groups of {q.group_size}"
        )


def quantize(x: torch.Tensor, block: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``x`` (..., k) to int8 codes (..., k) and float32 scales (..., k // block)."""
    k = x.shape[-1]
    xb = x.detach().float().reshape(*x.shape[:-1], k // block, block)
    amax = xb.abs().amax(-1, keepdim=True)
    c127 = torch.full_like(amax, 127.0)
    # Tensor by tensor: a Python scalar divisor or dividend may be turned into a reciprocal
    # multiplication, which rounds differently from the kernel's division.
    scale = amax / c127
    inv = torch.where(amax > 0, c127 / amax, torch.zeros_like(amax))
    codes = (xb * inv).round().clamp(-127, 127).to(torch.int8)
    return codes.reshape(x.shape), scale.squeeze(-1)


def dequantize(codes: torch.Tensor, scales: torch.Tensor, block: int) -> torch.Tensor:
    k = codes.shape[-1]
    xb = codes.float().reshape(*codes.shape[:-1], k // block, block) * scales.unsqueeze(-1)
    return xb.reshape(codes.shape)


def linear(x: torch.Tensor, q: QuantizedTensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``dequantize(quantize(x)) @ dequantize(q).T + bias`` in fp32, returned in ``x.dtype``."""
    from ds.ops import quant

    check_weight(q)
    codes, scales = quantize(x, q.group_size)
    w = quant.dequantize(q, torch.float32, impl="reference")
    y = F.linear(dequantize(codes, scales, q.group_size), w, None if bias is None else bias.float())
    return y.to(x.dtype)
