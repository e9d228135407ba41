"""Round-trip bounds, layout and input validation of the quantizers (all three implementations
share the checks; the reference is exercised here, the others by parity in their own files)."""

from __future__ import annotations

import math

import hypothesis.extra.numpy as hnp
import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from ds.interfaces.errors import ConfigError, KernelError
from ds.interfaces.kernels import QuantizedTensor
from ds.ops import quant
from ds.ops.quant import reference

SCHEMES = list(quant.SCHEMES)

FP8_BITS = {"fp8_e4m3": (3, -6), "fp8_e5m2": (2, -14)}  # mantissa bits, smallest normal exponent


def per_element_scale(q: QuantizedTensor, n: int) -> torch.Tensor:
    return q.scales.repeat_interleave(q.group_size)[:n]


def bound(x: torch.Tensor, q: QuantizedTensor) -> torch.Tensor:
    """Largest allowed |x - dequantize(q)| per element of the flattened float32 input.

    Integer schemes: half a quantization step (scale / 2), plus float32 rounding of x * (1/scale).
    fp8: half an ulp of the fp8 value (relative 2^-(M+1)) or half the subnormal step.
    """
    xf = x.detach().reshape(-1).double()
    s = per_element_scale(q, xf.numel()).double()
    if q.scheme.startswith("int"):
        return s * (0.5 + 1e-4) + xf.abs() * 1e-6
    m, emin = FP8_BITS[q.scheme]
    return xf.abs() * 2.0 ** -(m + 1) + s * 2.0 ** (emin - m - 1) + xf.abs() * 1e-6 + 1e-30


@pytest.mark.parametrize("impl", ["reference", "native"])
@pytest.mark.parametrize("scheme", SCHEMES)
@pytest.mark.parametrize("shape,group_size", [((1,), 1), ((7,), 3), ((4, 33), 16), ((1023,), 64)])
def test_round_trip_within_theoretical_bound(
    impl: str, scheme: str, shape: tuple[int, ...], group_size: int
) -> None:
    torch.manual_seed(1)
    x = torch.randn(shape) * torch.logspace(-3, 3, math.prod(shape)).reshape(shape)
    q = quant.quantize(x, scheme, group_size, impl=impl)  # type: ignore[arg-type]
    y = quant.dequantize(q, impl=impl)  # type: ignore[arg-type]
    assert y.shape == x.shape and y.dtype == torch.float32
    err = (x.reshape(-1).double() - y.reshape(-1).double()).abs()
    assert bool((err <= bound(x, q)).all()), float((err - bound(x, q)).max())


@pytest.mark.parametrize("scheme", SCHEMES)
def test_layout_and_padding(scheme: str) -> None:
    x = torch.arange(1, 11, dtype=torch.float32)  # 10 elements, groups of 4: last group padded
    q = reference.quantize(x, scheme, 4)
    assert q.shape == (10,) and q.group_size == 4 and q.scheme == scheme
    assert q.scales.shape == (3,) and q.scales.dtype == torch.float32
    assert q.data.numel() == (3 * 2 if scheme.startswith("int4") else 3 * 4)
    assert (q.zero_points is not None) == scheme.endswith("asym")
    # the padded tail decodes to exactly 0, so the last group's scale comes from 9 and 10 only
    full = reference.dequantize(QuantizedTensor(q.data, q.scales, q.zero_points, (12,), 4, scheme))
    assert full[10:].tolist() == [0.0, 0.0]
    hi = 10.0
    qmax = {"int8_sym": 127, "int8_asym": 255, "int4_sym": 7, "int4_asym": 15}
    fmax = {"fp8_e4m3": 448.0, "fp8_e5m2": 57344.0}
    expected = hi / qmax[scheme] if scheme in qmax else hi / fmax[scheme]
    assert q.scales[2].item() == pytest.approx(expected, rel=1e-6)


@pytest.mark.parametrize("scheme", SCHEMES)
def test_zero_and_constant_groups_are_exact(scheme: str) -> None:
    x = torch.tensor([0.0] * 8 + [2.5] * 8 + [-3.0] * 8)
    y = quant.dequantize(quant.quantize(x, scheme, 8))
    assert torch.equal(y, x)


def test_int4_packs_two_codes_per_byte() -> None:
    x = torch.tensor([-7.0, 7.0, 0.0, 1.0])
    q = reference.quantize(x, "int4_sym", 4)
    assert q.data.tolist() == [(7 + 8) << 4 | (-7 + 8), (1 + 8) << 4 | 8]


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float64])
def test_low_and_high_precision_inputs(dtype: torch.dtype) -> None:
    x = torch.randn(300).to(dtype)
    q = quant.quantize(x, "int8_sym", 64)
    y = quant.dequantize(q, dtype=dtype)
    assert y.dtype == dtype
    assert torch.equal(q.data, reference.quantize(x, "int8_sym", 64).data)


@pytest.mark.parametrize("impl", ["reference", "native"])
def test_bad_inputs_raise_clear_errors(impl: str) -> None:
    x = torch.randn(16)
    with pytest.raises(ConfigError, match="unknown quantization scheme 'int3'"):
        quant.quantize(x, "int3", 8, impl=impl)  # type: ignore[arg-type]
    for gs in (0, -4, 2.5, True, "8"):
        with pytest.raises(ConfigError, match="group_size must be a positive int"):
            quant.quantize(x, "int8_sym", gs, impl=impl)  # type: ignore[arg-type]
    with pytest.raises(KernelError, match="floating-point tensor"):
        quant.quantize(torch.arange(16), "int8_sym", 8, impl=impl)  # type: ignore[arg-type]
    with pytest.raises(KernelError, match="empty tensor"):
        quant.quantize(torch.empty(0), "int8_sym", 8, impl=impl)  # type: ignore[arg-type]
    with pytest.raises(KernelError, match=r"torch\.Tensor"):
        quant.quantize([1.0, 2.0], "int8_sym", 8, impl=impl)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="unknown quantizer impl"):
        quant.quantize(x, "int8_sym", 8, impl="cuda")  # type: ignore[arg-type]


@pytest.mark.parametrize("impl", ["reference", "native"])
def test_inconsistent_quantized_tensor_is_rejected(impl: str) -> None:
    q = quant.quantize(torch.randn(20), "int8_asym", 8)
    bad = [
        QuantizedTensor(q.data[:-1], q.scales, q.zero_points, q.shape, 8, q.scheme),
        QuantizedTensor(q.data, q.scales[:2], q.zero_points, q.shape, 8, q.scheme),
        QuantizedTensor(q.data, q.scales, None, q.shape, 8, q.scheme),
        QuantizedTensor(q.data.view(torch.int8), q.scales, q.zero_points, q.shape, 8, q.scheme),
        QuantizedTensor(q.data, q.scales.double(), q.zero_points, q.shape, 8, q.scheme),
        QuantizedTensor(q.data, q.scales, q.zero_points, q.shape, 8, "int8_sym"),
    ]
    for b in bad:
        with pytest.raises(KernelError):
            quant.dequantize(b, impl=impl)  # type: ignore[arg-type]


def test_native_rejects_non_cpu_tensors() -> None:
    with pytest.raises(KernelError, match="CPU tensors"):
        quant.quantize(torch.randn(8, device="meta"), "int8_sym", 8, impl="native")


@settings(max_examples=80, deadline=None)
@given(
    x=hnp.arrays(
        np.float32,
        st.integers(1, 200),
        elements=st.floats(-(2.0**100), 2.0**100, allow_nan=False, allow_subnormal=True, width=32),
    ),
    scheme=st.sampled_from(SCHEMES),
    group_size=st.integers(1, 64),
)
def test_round_trip_bound_hypothesis(x: np.ndarray, scheme: str, group_size: int) -> None:
    t = torch.from_numpy(x.copy())
    q = quant.quantize(t, scheme, group_size)
    err = (t.double() - quant.dequantize(q).double()).abs()
    assert bool((err <= bound(t, q)).all())


@pytest.mark.parametrize("impl", ["reference", "native"])
def test_spread_beyond_float32_range_stays_finite(impl: str) -> None:
    # max - min overflows float32; the scale must not, or every value decodes to NaN.
    big = torch.finfo(torch.float32).max * 0.9
    x = torch.tensor([big, -big, 1.0, -2.0e37, 3.0e38])
    quantize = reference.quantize if impl == "reference" else native_quantize()
    for scheme in SCHEMES:
        q = quantize(x, scheme, 5)
        y = quant.dequantize(q)
        assert bool(q.scales.isfinite().all()) and bool(y.isfinite().all()), scheme
        err = (x.double() - y.double()).abs()
        assert bool((err <= bound(x, q)).all()), scheme


@pytest.mark.parametrize("impl", ["reference", "native"])
def test_smallest_subnormals_keep_a_nonzero_scale(impl: str) -> None:
    # absmax / qmax underflows to 0 here; a zero scale would encode every value as 0.
    tiniest = torch.finfo(torch.float32).smallest_normal * torch.finfo(torch.float32).eps
    x = torch.tensor([1.0, -2.0, 3.0, 0.0, 1.0]) * tiniest
    quantize = reference.quantize if impl == "reference" else native_quantize()
    for scheme in SCHEMES:
        q = quantize(x, scheme, 5)
        assert bool((q.scales > 0).all()), scheme
        err = (x.double() - quant.dequantize(q).double()).abs()
        assert bool((err <= bound(x, q)).all()), scheme


def native_quantize():  # type: ignore[no-untyped-def]
    from ds.ops.quant import native

    return native.quantize


@pytest.mark.parametrize("impl", ["reference", "native"])
def test_dequantize_into_out(impl: str) -> None:
    x = torch.randn(3, 50)
    q = quant.quantize(x, "int4_sym", 32)
    out = torch.full((150,), float("nan"))
    y = quant.dequantize(q, impl=impl, out=out)  # type: ignore[arg-type]
    assert y.shape == (3, 50) and y.data_ptr() == out.data_ptr()
    assert torch.equal(y, quant.dequantize(q))
    for bad in (torch.empty(149), torch.empty(150, dtype=torch.float64), torch.empty(300)[::2]):
        with pytest.raises(KernelError, match="out must be"):
            quant.dequantize(q, impl=impl, out=bad)  # type: ignore[arg-type]
