"""The ``cuda`` kernel provider (entry point ``ds.kernels: cuda``): optimizer steps on flat
device buffers, group-wise quantizers on the device, and the host's async file I/O.

Optimizer backends, chosen once per provider (``backend=``, default ``"auto"``):

- ``triton``: the fused kernels of :mod:`ds.ops.triton` (Adam/AdamW, Lion, Adagrad), one launch
  per flat buffer, on the buffer's own device;
- ``torch``: where Triton is not installed, ``torch._fused_adam_``/``_fused_adamw_`` for Adam
  (same dtype for every buffer, bias correction on) and the pure-torch references of
  :mod:`ds.ops.triton` otherwise (whole-buffer elementwise ops; torch has no fused Lion and no
  CUDA fused Adagrad).

``auto`` is ``triton`` when the package imports, else ``torch``. Tensors without data (the
simulated devices' fake tensors) always take the pure-torch references, which only trace shapes,
devices and dtypes. No backend loops over chunks in Python.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Literal

from ds.interfaces.errors import ConfigError, KernelError
from ds.interfaces.kernels import AdagradHyper, AdamHyper, LionHyper, QuantizedTensor

if TYPE_CHECKING:
    import torch

    from ds.interfaces.kernels import AsyncIOHandle

Backend = Literal["auto", "triton", "torch"]

__all__ = ["CudaKernelProvider", "triton_available"]


def triton_available() -> bool:
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    return True


def _is_fake(t: torch.Tensor) -> bool:
    from torch._subclasses.fake_tensor import is_fake

    return bool(is_fake(t))


class CudaKernelProvider:
    """Implements :class:`ds.interfaces.kernels.KernelProvider` for accelerator tensors."""

    def __init__(self, backend: Backend = "auto") -> None:
        if backend not in ("auto", "triton", "torch"):
            raise ConfigError(f"backend={backend!r}: use 'auto', 'triton' or 'torch'")
        if backend == "triton" and not triton_available():
            raise KernelError(
                "backend='triton' needs the 'triton' package (pip install 'ds-ops-kernels[triton]')"
            )
        self._backend = backend

    @property
    def backend(self) -> str:
        """The optimizer backend in use: ``triton`` or ``torch``."""
        if self._backend == "auto":
            self._backend = "triton" if triton_available() else "torch"
        return self._backend

    def name(self) -> str:
        return "cuda"

    def devices(self) -> Sequence[str]:
        return ("cuda",)

    def info(self) -> dict[str, str]:
        version = "absent"
        if triton_available():
            import triton

            version = str(triton.__version__)
        return {"provider": "cuda", "optimizer_backend": self.backend, "triton": version}

    def new_state(self, like: torch.Tensor, avoid: Sequence[torch.Tensor] = ()) -> torch.Tensor:
        """Zeroed state like ``like`` on its device (the caching allocator picks the address)."""
        import torch

        return torch.zeros(like.shape, dtype=like.dtype, device=like.device)

    def _reference(self, params: torch.Tensor) -> bool:
        return self.backend == "torch" or _is_fake(params)

    # optimizer steps ---------------------------------------------------------------------
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
        kw: dict[str, Any] = {
            "step": step,
            "lr": hyper.lr,
            "beta1": hyper.beta1,
            "beta2": hyper.beta2,
            "eps": hyper.eps,
            "weight_decay": hyper.weight_decay,
            "adamw_mode": hyper.adamw_mode,
            "bias_correction": hyper.bias_correction,
            "low_precision_out": low_precision_out,
        }
        if not self._reference(params):
            from ds.ops.triton import adam

            adam.adam_step(params, grads, exp_avg, exp_avg_sq, **kw)
            return
        if step < 1:
            raise KernelError("step must be >= 1 (the count of this update, starting at 1)")
        if not _is_fake(params) and _torch_fused_adam(params, grads, exp_avg, exp_avg_sq, **kw):
            return
        from ds.ops.triton import adam_reference

        adam_reference.adam_step(params, grads, exp_avg, exp_avg_sq, **kw)

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
        kw: dict[str, Any] = {
            "lr": hyper.lr,
            "eps": hyper.eps,
            "weight_decay": hyper.weight_decay,
            "low_precision_out": low_precision_out,
        }
        if self._reference(params):
            from ds.ops.triton import adagrad_reference as impl
        else:
            from ds.ops.triton import adagrad as impl  # type: ignore[no-redef]
        impl.adagrad_step(params, grads, state_sum, **kw)

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
        kw: dict[str, Any] = {
            "lr": hyper.lr,
            "beta1": hyper.beta1,
            "beta2": hyper.beta2,
            "weight_decay": hyper.weight_decay,
            "low_precision_out": low_precision_out,
        }
        if self._reference(params):
            from ds.ops.triton import lion_reference as impl
        else:
            from ds.ops.triton import lion as impl  # type: ignore[no-redef]
        impl.lion_step(params, grads, exp_avg, **kw)

    # quantizers and file I/O -----------------------------------------------------------------
    def _quant_impl(self, device: torch.device) -> str:
        if device.type == "cpu":
            return "native"
        return "triton" if self.backend == "triton" else "reference"

    def quantize(self, x: torch.Tensor, scheme: str, group_size: int) -> QuantizedTensor:
        from ds.ops import quant

        return quant.quantize(x, scheme, group_size, impl=self._quant_impl(x.device))  # type: ignore[no-any-return]

    def dequantize(self, q: QuantizedTensor, dtype: torch.dtype | None = None) -> torch.Tensor:
        from ds.ops import quant

        return quant.dequantize(q, dtype, impl=self._quant_impl(q.data.device))  # type: ignore[no-any-return]

    def aio_handle(
        self,
        block_size: int = 1 << 20,
        queue_depth: int = 8,
        intra_op_parallelism: int = 1,
        single_submit: bool = False,
        overlap_events: bool = True,
        use_o_direct: bool = True,
    ) -> AsyncIOHandle:
        # File I/O moves host buffers (pinned staging); the native handle serves every device.
        from ds.ops import aio

        return aio.AsyncIOHandle(  # type: ignore[no-any-return]
            block_size=block_size,
            queue_depth=queue_depth,
            intra_op_parallelism=intra_op_parallelism,
            single_submit=single_submit,
            overlap_events=overlap_events,
            use_o_direct=use_o_direct,
        )


def _torch_fused_adam(
    params: torch.Tensor,
    grads: torch.Tensor,
    exp_avg: torch.Tensor,
    exp_avg_sq: torch.Tensor,
    *,
    step: int,
    lr: float,
    beta1: float,
    beta2: float,
    eps: float,
    weight_decay: float,
    adamw_mode: bool,
    bias_correction: bool,
    low_precision_out: torch.Tensor | None,
) -> bool:
    """torch's fused Adam/AdamW kernel on one flat buffer; False where it does not apply."""
    import torch

    dtypes = {params.dtype, grads.dtype, exp_avg.dtype, exp_avg_sq.dtype}
    if len(dtypes) != 1 or not bias_correction:
        return False
    fused = torch._fused_adamw_ if adamw_mode else torch._fused_adam_
    # The fused op reads the step count of this update (torch.optim increments it first).
    steps = [torch.full((), float(step), dtype=torch.float32, device=params.device)]
    fused(
        [params],
        [grads],
        [exp_avg],
        [exp_avg_sq],
        [],
        steps,
        lr=lr,
        beta1=beta1,
        beta2=beta2,
        weight_decay=weight_decay,
        eps=eps,
        amsgrad=False,
        maximize=False,
    )
    if low_precision_out is not None:
        low_precision_out.copy_(params)
    return True
