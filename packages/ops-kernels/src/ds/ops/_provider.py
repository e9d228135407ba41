"""What the kernel providers of ds-ops-kernels share (``cpu``, ``cuda``, ``torch``).

Each :class:`~ds.interfaces.kernels.KernelProvider` optimizer step is one call of a functional
step, ``adam_step(params, grads, exp_avg, exp_avg_sq, *, step, lr, beta1, ...)`` and its Adagrad
and Lion siblings, whose keywords are the fields of the hyper-parameter dataclass; a provider
says only which steps serve a buffer (:meth:`KernelProviderBase.steps`) and which quantizer
(:meth:`KernelProviderBase.quant_impl`). File I/O is the native handle of :mod:`ds.ops.aio` for
every provider: it moves host buffers.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from ds.interfaces.kernels import AdagradHyper, AdamHyper, LionHyper, QuantizedTensor

if TYPE_CHECKING:
    import torch

    from ds.interfaces.kernels import AsyncIOHandle

__all__ = ["KernelProviderBase"]


class KernelProviderBase:
    """The provider methods; subclasses give ``name``, ``devices``, ``info`` and :meth:`steps`."""

    def steps(self, params: torch.Tensor) -> Any:
        """What steps ``params``: an object (module) with ``adam_step``, ``adagrad_step`` and
        ``lion_step`` taking the buffers and the hyper-parameters as keywords."""
        raise NotImplementedError

    def quant_impl(self, device: torch.device) -> str:
        """The :mod:`ds.ops.quant` implementation for tensors on ``device``."""
        return "auto"

    def new_state(self, like: torch.Tensor, avoid: Sequence[torch.Tensor] = ()) -> torch.Tensor:
        """Zeroed state like ``like`` on its device (the caching allocator picks the address)."""
        import torch

        return torch.zeros(like.shape, dtype=like.dtype, device=like.device)

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
        self.steps(params).adam_step(
            params,
            grads,
            exp_avg,
            exp_avg_sq,
            step=step,
            low_precision_out=low_precision_out,
            **vars(hyper),
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
        # Adagrad without lr decay does not depend on the step count.
        kw = vars(hyper)
        self.steps(params).adagrad_step(
            params, grads, state_sum, low_precision_out=low_precision_out, **kw
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
        # Lion has no bias correction: the step count does not enter.
        kw = vars(hyper)
        self.steps(params).lion_step(
            params, grads, exp_avg, low_precision_out=low_precision_out, **kw
        )

    def quantize(self, x: torch.Tensor, scheme: str, group_size: int) -> QuantizedTensor:
        from ds.ops import quant

        return quant.quantize(x, scheme, group_size, impl=self.quant_impl(x.device))  # type: ignore[arg-type]

    def dequantize(self, q: QuantizedTensor, dtype: torch.dtype | None = None) -> torch.Tensor:
        from ds.ops import quant

        return quant.dequantize(q, dtype, impl=self.quant_impl(q.data.device))  # type: ignore[arg-type]

    def quantized_linear(
        self,
        x: torch.Tensor,
        q: QuantizedTensor,
        bias: torch.Tensor | None = None,
        *,
        activations: str = "float",
    ) -> torch.Tensor:
        from ds.ops.quant.linear import linear

        impl = self.quant_impl(q.data.device)
        return linear(x, q, bias, impl=impl, activations=activations)

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

        # The handle takes the same options in the same order.
        return aio.AsyncIOHandle(  # type: ignore[no-any-return]
            block_size,
            queue_depth,
            intra_op_parallelism,
            single_submit,
            overlap_events,
            use_o_direct,
        )
