"""Weight-only group-wise int8/int4 quantization of the linear layers through a kernel provider.

Weights are stored quantized (int8: ~1/4, int4: ~1/8 of fp32 plus one fp32 scale per group); the
provider's ``quantized_linear`` multiplies by them (on a CPU, a decode step's few fp32 rows read
the codes directly; otherwise the weight is dequantized right before the matmul); activations
stay in the model dtype, unless ``activations: "int8"`` quantizes them per group-sized block. Quantized weights stay
on the engine's device (where the original weight was) and are dequantized there: a provider that
quantizes only on the host does it once at load, and the quantized tensor moves to the device.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
import torch.nn.functional as F

from ds.inference.config import QuantizationConfig
from ds.interfaces import registry
from ds.interfaces.errors import ConfigError, ProviderNotFoundError
from ds.interfaces.kernels import KernelProvider, QuantizedTensor


class QuantizedLinear:
    __slots__ = ("activations", "bias", "dtype", "provider", "weight")

    def __init__(
        self,
        provider: KernelProvider,
        weight: QuantizedTensor,
        bias: torch.Tensor | None,
        dtype: torch.dtype,
        activations: str = "float",
    ) -> None:
        self.provider = provider
        self.weight = weight
        self.bias = bias
        self.dtype = dtype
        self.activations = activations

    @property
    def nbytes(self) -> int:
        w = self.weight
        zp = (
            w.zero_points.numel() * w.zero_points.element_size() if w.zero_points is not None else 0
        )
        return w.data.numel() * w.data.element_size() + w.scales.numel() * 4 + zp

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.activations != "float":  # the provider quantizes x, whatever its dtype
            return self.provider.quantized_linear(
                x, self.weight, self.bias, activations=self.activations
            )
        if x.dtype == self.dtype:
            return self.provider.quantized_linear(x, self.weight, self.bias)
        return F.linear(x, self.provider.dequantize(self.weight, self.dtype), self.bias)


def to_device(q: QuantizedTensor, device: torch.device) -> QuantizedTensor:
    """``q`` with its data, scales and zero points on ``device`` (explicit copies)."""
    zp = q.zero_points.to(device) if q.zero_points is not None else None
    return dataclasses.replace(
        q, data=q.data.to(device), scales=q.scales.to(device), zero_points=zp
    )


def load_provider(name: str) -> KernelProvider:
    try:
        factory = registry.get(registry.KERNELS, name)
    except ProviderNotFoundError as exc:
        raise ConfigError(
            f"quantization needs a kernel provider named {name!r} (ds.kernels group): {exc}"
        ) from exc
    provider: KernelProvider = factory()
    return provider


def quantized_linear_factory(config: QuantizationConfig, device: str | torch.device = "cpu") -> Any:
    """Quantized linears through ``config.provider``, or the provider of ``device``'s type."""
    provider = load_provider(config.provider or torch.device(device).type)

    def make(weight: torch.Tensor, bias: torch.Tensor | None) -> QuantizedLinear:
        device = weight.device
        src = weight.detach().float().contiguous()
        if device.type in provider.devices():
            q = provider.quantize(src, config.scheme, config.group_size)
        else:
            q = to_device(provider.quantize(src.cpu(), config.scheme, config.group_size), device)
        return QuantizedLinear(provider, q, bias, weight.dtype, config.activations)

    make.quantizes_head = config.lm_head  # type: ignore[attr-defined]  # read by tied_head
    return make
