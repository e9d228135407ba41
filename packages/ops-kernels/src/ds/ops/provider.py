"""The ``cpu`` kernel provider (entry point ``ds.kernels: cpu``): native fused optimizer steps on
flat CPU buffers, group-wise quantizers, the async file I/O handle of ds-ops-kernels, and the
optional paged decode attention and fp16-weight linear kernels."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from ds.ops._provider import KernelProviderBase

if TYPE_CHECKING:
    import torch

__all__ = ["CpuKernelProvider"]


class CpuKernelProvider(KernelProviderBase):
    """Implements :class:`ds.interfaces.kernels.KernelProvider` for CPU tensors.

    Construction is free; the native module loads at the first kernel call or ``info()``.
    """

    def name(self) -> str:
        return "cpu"

    def devices(self) -> Sequence[str]:
        return ("cpu",)

    def info(self) -> dict[str, str]:
        from ds.ops._native import native_info

        return native_info()

    def steps(self, params: torch.Tensor) -> Any:
        from ds.ops import cpu_optim

        return cpu_optim

    # ds.interfaces.kernels.PagedAttentionKernels (ds.ops.attention).
    def paged_decode_applies(
        self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor
    ) -> bool:
        from ds.ops.attention import paged_decode_applies

        return paged_decode_applies(q, k_cache, v_cache)

    def paged_decode_attention(self, *args: Any, **kwargs: Any) -> torch.Tensor:
        from ds.ops.attention import paged_decode

        return paged_decode(*args, **kwargs)

    # ds.interfaces.kernels.HalfLinearKernels (ds.ops.half_linear).
    def half_linear_applies(self, x: torch.Tensor, weight: torch.Tensor) -> bool:
        from ds.ops.half_linear import applies

        return applies(x, weight)

    def half_linear(
        self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None
    ) -> torch.Tensor:
        from ds.ops.half_linear import linear

        return linear(x, weight, bias)

    def new_state(self, like: torch.Tensor, avoid: Sequence[torch.Tensor] = ()) -> torch.Tensor:
        """Zeroed state like ``like``, placed apart from ``avoid`` (:mod:`ds.ops.placement`)."""
        if like.device.type != "cpu":
            return super().new_state(like, avoid)
        from ds.ops.placement import zeros_apart

        return zeros_apart(like.shape, like.dtype, avoid)
