"""The ``torch`` kernel provider (entry point ``ds.kernels: torch``): the pure-torch reference
optimizer steps of :mod:`ds.ops.reference` and quantizers of :mod:`ds.ops.quant.reference`, on
tensors of any device (no native or Triton kernel), with the host's async file I/O.

It is the definition the other providers are checked against, and what steps tensors that hold
no data (the simulated devices' fake tensors).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from ds.ops._provider import KernelProviderBase

if TYPE_CHECKING:
    import torch

__all__ = ["TorchKernelProvider"]


class TorchKernelProvider(KernelProviderBase):
    """Implements :class:`ds.interfaces.kernels.KernelProvider` with whole-buffer torch ops."""

    def name(self) -> str:
        return "torch"

    def devices(self) -> Sequence[str]:
        return ("cpu", "cuda")

    def info(self) -> dict[str, str]:
        return {"provider": "torch", "optimizer_backend": "reference"}

    def steps(self, params: torch.Tensor) -> Any:
        from ds.ops import reference

        return reference

    def quant_impl(self, device: torch.device) -> str:
        return "reference"
