"""The Triton quantizers equal the reference and the native kernels byte for byte. On CPU they run
through the Triton interpreter (TRITON_INTERPRET=1, set before triton is imported); with a CUDA
device the ``gpu`` tests compare the compiled kernels."""

from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest

from ds.interfaces.errors import KernelError
from ds.ops import quant
from ds.ops.quant import native, reference

pytest.importorskip("triton", reason="triton is not installed (pip install ds-ops-kernels[triton])")
from ds.ops.triton import quant as triton_quant

SCHEMES = list(quant.SCHEMES)
interpreted = pytest.mark.skipif(
    os.environ.get("TRITON_INTERPRET") != "1", reason="needs TRITON_INTERPRET=1 to run on CPU"
)


def _same(a: quant.QuantizedTensor, b: quant.QuantizedTensor) -> bool:
    zp_same = (a.zero_points is None and b.zero_points is None) or (
        a.zero_points is not None
        and b.zero_points is not None
        and torch.equal(a.zero_points.cpu(), b.zero_points.cpu())
    )
    return (
        a.data.dtype == b.data.dtype
        and torch.equal(a.data.view(torch.uint8).cpu(), b.data.view(torch.uint8).cpu())
        and torch.equal(a.scales.cpu(), b.scales.cpu())
        and zp_same
    )


def _input(n: int, dtype: torch.dtype) -> torch.Tensor:
    g = torch.Generator().manual_seed(n)
    x = torch.randn(n, generator=g) * torch.exp(torch.randn(n, generator=g) * 2)
    x[: min(n, 3)] = 1e-7  # tiny values exercise the fp8 subnormal codes
    return x.to(dtype)


@interpreted
@pytest.mark.parametrize("scheme", SCHEMES)
@pytest.mark.parametrize("n,group_size", [(1, 1), (37, 7), (130, 32), (5000, 8)])
def test_triton_equals_native_and_reference(scheme: str, n: int, group_size: int) -> None:
    x = _input(n, torch.float32)
    t = triton_quant.quantize(x, scheme, group_size)
    assert _same(t, reference.quantize(x, scheme, group_size))
    assert _same(t, native.quantize(x, scheme, group_size))
    assert torch.equal(triton_quant.dequantize(t), native.dequantize(t))
    out = torch.empty(n)
    assert torch.equal(triton_quant.dequantize(t, out=out), native.dequantize(t))


@interpreted
@pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")  # the interpreter's numpy
def test_triton_edge_groups_equal_reference() -> None:
    # Smallest subnormals (absmax / qmax underflows) and opposite signs near the float32 maximum
    # (max - min overflows), one group of 4 each.
    tiniest = torch.finfo(torch.float32).smallest_normal * torch.finfo(torch.float32).eps
    big = torch.finfo(torch.float32).max * 0.9
    x = torch.tensor([tiniest, -2 * tiniest, 0.0, 3 * tiniest, big, -big, 1.0, -2.0e37])
    for scheme in SCHEMES:
        t = triton_quant.quantize(x, scheme, 4)
        assert _same(t, reference.quantize(x, scheme, 4)), scheme
        assert _same(t, native.quantize(x, scheme, 4)), scheme
        assert torch.equal(triton_quant.dequantize(t), native.dequantize(t)), scheme


@interpreted
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_triton_low_precision_inputs(dtype: torch.dtype) -> None:
    x = _input(50, dtype)
    for scheme in ("int4_asym", "fp8_e4m3"):
        assert _same(triton_quant.quantize(x, scheme, 16), native.quantize(x, scheme, 16))


def test_triton_on_cpu_without_interpreter_is_a_clear_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with pytest.raises(KernelError, match="run on GPU tensors"):
        triton_quant.quantize(torch.randn(8), "int8_sym", 8)


@pytest.mark.gpu
@pytest.mark.parametrize("scheme", SCHEMES)
def test_triton_on_gpu_equals_native(scheme: str) -> None:
    x = _input(100_003, torch.float32)
    t = quant.quantize(x.cuda(), scheme, 256)
    assert _same(t, native.quantize(x, scheme, 256))
    assert torch.equal(
        quant.dequantize(t).cpu(), native.dequantize(native.quantize(x, scheme, 256))
    )
