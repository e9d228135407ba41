"""The ``cuda`` kernel provider (entry point ``ds.kernels: cuda``): optimizer steps on flat
device buffers, group-wise quantizers on the device, and the host's async file I/O.

Optimizer backends, chosen once per provider (``backend=``, default ``"auto"``):

- ``triton``: the fused kernels of :mod:`ds.ops.triton` (Adam/AdamW, Lion, Adagrad), one launch
  per flat buffer, on the buffer's own device;
- ``torch``: where Triton is not installed, ``torch._fused_adam_``/``_fused_adamw_`` for Adam
  (same dtype for every buffer, bias correction on) and the pure-torch references of
  :mod:`ds.ops.reference` otherwise (whole-buffer elementwise ops; torch has no fused Lion and no
  CUDA fused Adagrad).

``auto`` is ``triton`` when the package imports, else ``torch``. Tensors without data (the
simulated devices' fake tensors) always take the pure-torch references, which only trace shapes,
devices and dtypes. No backend loops over chunks in Python.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Literal, NamedTuple

from ds.interfaces.errors import ConfigError, KernelError
from ds.ops._provider import KernelProviderBase

if TYPE_CHECKING:
    import torch

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


class CudaKernelProvider(KernelProviderBase):
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

    def _reference(self, params: torch.Tensor) -> bool:
        return self.backend == "torch" or _is_fake(params)

    def steps(self, params: torch.Tensor) -> Any:
        if self._reference(params):
            from ds.ops import reference

            return _Steps(_torch_adam_step, reference.adagrad_step, reference.lion_step)
        from ds.ops.triton import adagrad, adam, lion

        return _Steps(adam.adam_step, adagrad.adagrad_step, lion.lion_step)

    def quant_impl(self, device: torch.device) -> str:
        if device.type == "cpu":
            return "native"
        return "triton" if self.backend == "triton" else "reference"


class _Steps(NamedTuple):
    adam_step: Callable[..., None]
    adagrad_step: Callable[..., None]
    lion_step: Callable[..., None]


def _torch_adam_step(
    params: torch.Tensor,
    grads: torch.Tensor,
    exp_avg: torch.Tensor,
    exp_avg_sq: torch.Tensor,
    **kw: Any,
) -> None:
    """torch's fused Adam/AdamW kernel on one flat buffer where it applies (one dtype for every
    buffer, bias correction on, data present), else the reference; ``kw``: the reference's."""
    import torch

    from ds.ops import reference

    if kw["step"] < 1:
        raise KernelError("step must be >= 1 (the count of this update, starting at 1)")
    dtypes = {params.dtype, grads.dtype, exp_avg.dtype, exp_avg_sq.dtype}
    if _is_fake(params) or len(dtypes) != 1 or not kw["bias_correction"]:
        reference.adam_step(params, grads, exp_avg, exp_avg_sq, **kw)
        return
    fused = torch._fused_adamw_ if kw["adamw_mode"] else torch._fused_adam_
    # The fused op reads the step count of this update (torch.optim increments it first).
    steps = [torch.full((), float(kw["step"]), dtype=torch.float32, device=params.device)]
    hyper = {k: kw[k] for k in ("lr", "beta1", "beta2", "weight_decay", "eps")}
    fused(
        [params],
        [grads],
        [exp_avg],
        [exp_avg_sq],
        [],
        steps,
        amsgrad=False,
        maximize=False,
        **hyper,
    )
    out = kw.get("low_precision_out")
    if out is not None:
        out.copy_(params)
