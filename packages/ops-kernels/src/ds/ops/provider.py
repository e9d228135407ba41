"""The ``cpu`` kernel provider (entry point ``ds.kernels: cpu``): native fused optimizer steps on
flat CPU buffers, group-wise quantizers and the async file I/O handle of ds-ops-kernels."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from ds.interfaces.kernels import AdagradHyper, AdamHyper, LionHyper, QuantizedTensor
from ds.ops import cpu_optim

if TYPE_CHECKING:
    import torch

    from ds.interfaces.kernels import AsyncIOHandle

__all__ = ["CpuKernelProvider"]


class CpuKernelProvider:
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

    def new_state(self, like: torch.Tensor, avoid: Sequence[torch.Tensor] = ()) -> torch.Tensor:
        """Zeroed state like ``like``, placed apart from ``avoid`` (:mod:`ds.ops.placement`)."""
        if like.device.type != "cpu":
            import torch

            return torch.zeros(like.shape, dtype=like.dtype, device=like.device)
        from ds.ops.placement import zeros_apart

        return zeros_apart(like.shape, like.dtype, avoid)

    def adam_step(
        self,
        step: int,
        hyper: AdamHyper,
        params: torch.Tensor,
        grads: torch.Tensor,
        exp_avg: torch.Tensor,
        exp_avg_sq: torch.Tensor,
        low_precision_out: torch.Tensor | None = None,
    ) -> None:
        cpu_optim.adam_step(
            params,
            grads,
            exp_avg,
            exp_avg_sq,
            step=step,
            lr=hyper.lr,
            beta1=hyper.beta1,
            beta2=hyper.beta2,
            eps=hyper.eps,
            weight_decay=hyper.weight_decay,
            adamw_mode=hyper.adamw_mode,
            bias_correction=hyper.bias_correction,
            low_precision_out=low_precision_out,
        )

    def adagrad_step(
        self,
        step: int,
        hyper: AdagradHyper,
        params: torch.Tensor,
        grads: torch.Tensor,
        state_sum: torch.Tensor,
        low_precision_out: torch.Tensor | None = None,
    ) -> None:
        del step  # Adagrad without lr decay does not depend on the step count
        cpu_optim.adagrad_step(
            params,
            grads,
            state_sum,
            lr=hyper.lr,
            eps=hyper.eps,
            weight_decay=hyper.weight_decay,
            low_precision_out=low_precision_out,
        )

    def lion_step(
        self,
        step: int,
        hyper: LionHyper,
        params: torch.Tensor,
        grads: torch.Tensor,
        exp_avg: torch.Tensor,
        low_precision_out: torch.Tensor | None = None,
    ) -> None:
        del step  # Lion has no bias correction
        cpu_optim.lion_step(
            params,
            grads,
            exp_avg,
            lr=hyper.lr,
            beta1=hyper.beta1,
            beta2=hyper.beta2,
            weight_decay=hyper.weight_decay,
            low_precision_out=low_precision_out,
        )

    def quantize(self, x: torch.Tensor, scheme: str, group_size: int) -> QuantizedTensor:
        from ds.ops import quant

        return quant.quantize(x, scheme, group_size)  # type: ignore[no-any-return]

    def dequantize(self, q: QuantizedTensor, dtype: torch.dtype | None = None) -> torch.Tensor:
        from ds.ops import quant

        return quant.dequantize(q, dtype)  # type: ignore[no-any-return]

    def aio_handle(
        self,
        block_size: int = 1 << 20,
        queue_depth: int = 8,
        intra_op_parallelism: int = 1,
        single_submit: bool = False,
        overlap_events: bool = True,
        use_o_direct: bool = True,
    ) -> AsyncIOHandle:
        from ds.ops import aio

        return aio.AsyncIOHandle(  # type: ignore[no-any-return]
            block_size=block_size,
            queue_depth=queue_depth,
            intra_op_parallelism=intra_op_parallelism,
            single_submit=single_submit,
            overlap_events=overlap_events,
            use_o_direct=use_o_direct,
        )
