"""Pure-torch SwiGLU, ``silu(a) * b``: the definition the Triton kernel is tested against."""

from __future__ import annotations

import torch


def swiglu(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """silu(a) * b computed in float32 (float64 stays float64), returned in a's dtype."""
    wide = torch.float64 if a.dtype == torch.float64 else torch.float32
    af, bf = a.to(wide), b.to(wide)
    return (af * torch.sigmoid(af) * bf).to(a.dtype)


def swiglu_backward(
    grad: torch.Tensor, a: torch.Tensor, b: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Gradients of silu(a) * b: d/da = g * b * s * (1 + a * (1 - s)) with s = sigmoid(a),
    d/db = g * silu(a)."""
    wide = torch.float64 if a.dtype == torch.float64 else torch.float32
    g, af, bf = grad.to(wide), a.to(wide), b.to(wide)
    s = torch.sigmoid(af)
    da = g * bf * s * (1 + af * (1 - s))
    db = g * af * s
    return da.to(a.dtype), db.to(b.dtype)
