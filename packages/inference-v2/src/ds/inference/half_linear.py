"""The linear layers of an fp16 model on the CPU through a kernel provider's fp16-weight kernel.

torch's CPU fp16 matrix-vector product is no faster than its fp32 one although it reads half the
bytes, and a decode step (one row per sequence) is bound by the bytes of weight it reads. The
``cpu`` provider of ds-ops-kernels has a kernel
(:class:`~ds.interfaces.kernels.HalfLinearKernels`) that streams the fp16 weight once, converts
it in registers and sums in fp32; its ``half_linear_applies`` says for which inputs it is the
faster path (a few rows: decode steps), and every other input (prefill) keeps the dense form
(``F.linear``, the output head's ``weight @ x^T``). Without ds-ops-kernels installed (no ``cpu``
provider, or one without the kernel) an fp16 model runs every linear through torch, as before.
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

    __slots__ = ("applies", "bias", "dense", "kernel", "weight")

    def __init__(self, dense: DenseLinear, kernels: HalfLinearKernels) -> None:
        self.dense = dense
        self.weight = dense.weight
        self.bias = dense.bias
        self.applies = kernels.half_linear_applies
        self.kernel = kernels.half_linear

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.applies(x, self.weight):
            return self.kernel(x, self.weight, self.bias)
        return self.dense(x)


def half_linear_factory(dtype: torch.dtype, device: str | torch.device) -> Any:
    """A linear factory for a model of ``dtype`` on ``device``: :class:`HalfLinear` for fp16 on
    the CPU when the ``cpu`` provider has the kernel, else None (the models' dense linears). Its
    ``make_head`` builds the output head the same way."""
    if dtype != torch.float16 or torch.device(device).type != "cpu":
        return None
    try:
        provider = registry.get(registry.KERNELS, "cpu")()
    except ProviderNotFoundError as exc:
        log.debug("fp16 linears through torch: no cpu kernel provider", reason=str(exc))
        return None
    if not isinstance(provider, HalfLinearKernels):
        log.debug("fp16 linears through torch: the cpu kernel provider has no fp16-weight linear")
        return None

    def make(weight: torch.Tensor, bias: torch.Tensor | None) -> LinearFn:
        return HalfLinear(DenseLinear(weight, bias), provider)

    def make_head(weight: torch.Tensor, bias: torch.Tensor | None) -> LinearFn:
        return HalfLinear(DenseHead(weight, bias), provider)

    make.make_head = make_head  # type: ignore[attr-defined]  # read by tied_head
    return make
