"""The linear layers of an fp16 or fp32 model on the CPU through a kernel provider's
few-rows linear kernel.

A decode step (one row per sequence) is bound by the bytes of weight it reads. torch's CPU fp16
matrix-vector product is no faster than its fp32 one although it reads half the bytes, and its
fp32 GEMM (MKL) at a few rows takes about twice the time of one pass over the weight. The ``cpu``
provider of ds-ops-kernels has a kernel (:class:`~ds.interfaces.kernels.HalfLinearKernels`) that
streams the fp16 or fp32 weight once in place (fp16 converted in registers) and sums in fp32;
its ``half_linear_applies`` says for which inputs it is the faster path (a few rows: decode
steps), and every other input (prefill past those rows) keeps the dense form (``F.linear``, the
output head's ``weight @ x^T``). Without ds-ops-kernels installed (no ``cpu`` provider, or one
without the kernel) the model runs every linear through torch, as before.
"""

from __future__ import annotations

from typing import Any

import torch

from ds.inference.models.blocks import DenseHead, DenseLinear, LinearFn
from ds.interfaces import registry
from ds.interfaces.errors import ProviderNotFoundError
from ds.interfaces.kernels import HalfLinearKernels
from ds.interfaces.logging import get_logger

log = get_logger(__name__)


class HalfLinear:
    """``dense``'s weight through the provider's kernel where it applies, ``dense`` elsewhere."""

    __slots__ = ("applies", "dense", "kernel")

    def __init__(self, dense: DenseLinear, kernels: HalfLinearKernels) -> None:
        self.dense = dense
        self.applies = kernels.half_linear_applies
        self.kernel = kernels.half_linear

    # The weight and bias live in ``dense`` alone, so that replacing one (a test swapping in
    # other weights, a loader) changes both paths.
    @property
    def weight(self) -> torch.Tensor:
        return self.dense.weight

    @weight.setter
    def weight(self, value: torch.Tensor) -> None:
        self.dense.weight = value

    @property
    def bias(self) -> torch.Tensor | None:
        return self.dense.bias

    @bias.setter
    def bias(self, value: torch.Tensor | None) -> None:
        self.dense.bias = value

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        dense = self.dense
        if self.applies(x, dense.weight):
            return self.kernel(x, dense.weight, dense.bias)
        return dense(x)


def half_linear_factory(dtype: torch.dtype, device: str | torch.device) -> Any:
    """A linear factory for a model of ``dtype`` on ``device``: :class:`HalfLinear` for fp16 or
    fp32 on the CPU when the ``cpu`` provider has the kernel, else None (the models' dense
    linears). Its ``make_head`` builds the output head the same way."""
    if dtype not in (torch.float16, torch.float32) or torch.device(device).type != "cpu":
        return None
    try:
        provider = registry.get(registry.KERNELS, "cpu")()
    except ProviderNotFoundError as exc:
        log.debug("linears through torch: no cpu kernel provider", reason=str(exc))
        return None
    if not isinstance(provider, HalfLinearKernels):
        log.debug("linears through torch: the cpu kernel provider has no few-rows linear")
        return None

    def make(weight: torch.Tensor, bias: torch.Tensor | None) -> LinearFn:
        return HalfLinear(DenseLinear(weight, bias), provider)

    def make_head(weight: torch.Tensor, bias: torch.Tensor | None) -> LinearFn:
        return HalfLinear(DenseHead(weight, bias), provider)

    make.make_head = make_head  # type: ignore[attr-defined]  # read by tied_head
    return make
