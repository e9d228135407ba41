"""Group-wise quantization: int8/int4 (symmetric and asymmetric) and fp8 (e4m3, e5m2).

``quantize(x, scheme, group_size)`` returns a :class:`~ds.interfaces.kernels.QuantizedTensor`;
``dequantize(q, dtype=None)`` decodes it (float32 unless ``dtype`` is given). Three
implementations produce identical bytes: ``native`` (C++, CPU tensors), ``triton`` (GPU tensors)
and ``reference`` (pure torch, any device). ``impl="auto"`` picks native for CPU tensors and
Triton for GPU tensors.
"""

from __future__ import annotations

from typing import Literal

import torch

from ds.interfaces.errors import ConfigError
from ds.interfaces.kernels import QuantizedTensor
from ds.ops.quant._schemes import SCHEMES

Impl = Literal["auto", "native", "triton", "reference"]

__all__ = ["SCHEMES", "QuantizedTensor", "dequantize", "quantize"]


def _pick(impl: str, device: torch.device):  # type: ignore[no-untyped-def]
    if impl == "auto":
        impl = "native" if device.type == "cpu" else "triton"
    if impl == "native":
        from ds.ops.quant import native

        return native
    if impl == "triton":
        from ds.ops.triton import quant

        return quant
    if impl == "reference":
        from ds.ops.quant import reference

        return reference
    raise ConfigError(f"unknown quantizer impl {impl!r}; use auto, native, triton or reference")


def quantize(
    x: torch.Tensor, scheme: str, group_size: int, *, impl: Impl = "auto"
) -> QuantizedTensor:
    """Quantize ``x`` group-wise (flattened, groups of ``group_size``, last group padded)."""
    device = x.device if isinstance(x, torch.Tensor) else torch.device("cpu")
    return _pick(impl, device).quantize(x, scheme, group_size)  # type: ignore[no-any-return]


def dequantize(
    q: QuantizedTensor,
    dtype: torch.dtype | None = None,
    *,
    impl: Impl = "auto",
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Decode ``q`` back to a tensor of its original shape (float32 unless ``dtype``).

    ``out``: a contiguous float32 tensor of ``q``'s element count to decode into (reused
    buffers avoid page faults on large outputs); the float32 result is a view of it."""
    device = q.data.device if isinstance(q, QuantizedTensor) else torch.device("cpu")
    return _pick(impl, device).dequantize(q, dtype, out=out)  # type: ignore[no-any-return]
