"""The C++ quantizers produce exactly the reference's bytes, scales and decoded values."""

from __future__ import annotations

import hypothesis.extra.numpy as hnp
import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from ds.ops import quant
from ds.ops.quant import native, reference

SCHEMES = list(quant.SCHEMES)


def assert_same(a: quant.QuantizedTensor, b: quant.QuantizedTensor) -> None:
    assert a.data.dtype == b.data.dtype and a.shape == b.shape
    assert torch.equal(a.data.view(torch.uint8), b.data.view(torch.uint8))
    assert torch.equal(a.scales, b.scales)
    if a.zero_points is None:
        assert b.zero_points is None
    else:
        assert b.zero_points is not None and torch.equal(a.zero_points, b.zero_points)


@pytest.mark.parametrize("scheme", SCHEMES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize(
    "n,group_size",
    [(1, 1), (7, 2), (1023, 128), (4096 + 3, 512), (10**5 + 17, 4096), (40_005, 64)],
)
def test_native_equals_reference(scheme: str, dtype: torch.dtype, n: int, group_size: int) -> None:
    g = torch.Generator().manual_seed(n)
    x = (torch.randn(n, generator=g) * torch.exp(torch.randn(n, generator=g) * 2)).to(dtype)
    a, b = reference.quantize(x, scheme, group_size), native.quantize(x, scheme, group_size)
    assert_same(a, b)
    assert torch.equal(reference.dequantize(a), native.dequantize(b))


@pytest.mark.parametrize("scheme", ["fp8_e4m3", "fp8_e5m2"])
def test_fp8_every_code_decodes_like_torch(scheme: str) -> None:
    from ds.ops import _C

    codes = torch.arange(256, dtype=torch.uint8)
    fp8 = quant.SCHEMES[scheme].data_dtype
    # Scales: 1, one whose product with 2^8 overflows float32 (the AVX-512 e4m3 decode folds 2^8
    # into the scale), and a subnormal one.
    for scale in (1.0, 3e37, 1e-40):
        q = quant.QuantizedTensor(codes.view(fp8), torch.tensor([scale]), None, (256,), 256, scheme)
        want = codes.view(fp8).to(torch.float32) * torch.tensor(scale)
        keep = ~want.isnan()
        before = _C.simd_level()
        bits = {}
        try:
            for level in _C.simd_levels_built().split(","):
                if not _C.set_simd_level(level):
                    continue  # this CPU cannot run that variant
                got = native.dequantize(q)
                assert torch.equal(got.isnan(), want.isnan()), (level, scale)
                assert torch.equal(got[keep], want[keep]), (level, scale)
                bits[level] = got.view(torch.int32)
        finally:
            _C.set_simd_level(before)
        # NaN codes decode to the same NaN (sign | quiet NaN) at every level.
        first = bits.pop("scalar")
        for level, b in bits.items():
            assert torch.equal(b, first), (level, scale)


@settings(max_examples=60, deadline=None)
@given(
    x=hnp.arrays(
        np.float32,
        st.integers(1, 300),
        elements=st.floats(-1e6, 1e6, allow_nan=False, width=32),
    ),
    scheme=st.sampled_from(SCHEMES),
    group_size=st.integers(1, 70),
)
def test_native_equals_reference_hypothesis(x: np.ndarray, scheme: str, group_size: int) -> None:
    t = torch.from_numpy(x.copy())
    a, b = reference.quantize(t, scheme, group_size), native.quantize(t, scheme, group_size)
    assert_same(a, b)
    assert torch.equal(reference.dequantize(a), native.dequantize(b))


def test_native_threads_give_identical_bytes() -> None:
    from ds.ops import _C

    x = torch.randn(300_000)
    before = _C.get_num_threads()
    try:
        _C.set_num_threads(1)
        one = native.quantize(x, "int4_asym", 96)
        _C.set_num_threads(2)
        two = native.quantize(x, "int4_asym", 96)
    finally:
        _C.set_num_threads(before)
    assert_same(one, two)


def test_every_simd_variant_equals_reference(simd_level: str) -> None:
    g = torch.Generator().manual_seed(5)
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        x = (torch.randn(5003, generator=g) * torch.exp(torch.randn(5003, generator=g) * 2)).to(
            dtype
        )
        for scheme in SCHEMES:
            for gs in (5, 64, 128, 1000):
                a, b = reference.quantize(x, scheme, gs), native.quantize(x, scheme, gs)
                assert_same(a, b)
                assert torch.equal(reference.dequantize(a), native.dequantize(b))


def _edge_groups(dtype: torch.dtype) -> torch.Tensor:
    # One 128-element group each: all zeros, subnormals, the smallest subnormals, values near half the maximum of
    # `dtype` (so that max - min stays finite), exact rounding ties (k + 0.5 at scale 1), one
    # large outlier among small values, all negative, and signed zeros with positives
    # (asymmetric zero point at 0).
    g = torch.Generator().manual_seed(11)
    tiniest = torch.finfo(dtype).smallest_normal * torch.finfo(dtype).eps
    ties = torch.arange(-64, 64, dtype=torch.float32) + 0.5
    ties[0] = 127.0
    outlier = torch.randn(128, generator=g) * 1e-3
    outlier[77] = 1e4
    signed_zeros = torch.rand(128, generator=g)
    signed_zeros[::3] = -0.0
    groups = [
        torch.zeros(128),
        torch.randn(128, generator=g) * torch.finfo(dtype).tiny * 0.25,
        # The dtype's smallest subnormals: absmax / qmax underflows to 0 in float32.
        torch.randint(-3, 4, (128,), generator=g).float() * tiniest,
        torch.randn(128, generator=g).clamp(-1, 1) * torch.finfo(dtype).max * 0.49,
        # Opposite signs near the maximum: max - min overflows float32 (bf16 and fp32 inputs).
        torch.randn(128, generator=g).sign() * torch.finfo(dtype).max * 0.9,
        ties,
        outlier,
        -torch.rand(128, generator=g) - 0.1,
        signed_zeros,
    ]
    return torch.cat(groups).to(dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_edge_groups_equal_reference_at_every_level(simd_level: str, dtype: torch.dtype) -> None:
    # Whole groups of 128 take the AVX-512 group kernels; the portable loop must agree.
    x = _edge_groups(dtype)
    for scheme in SCHEMES:
        a, b = reference.quantize(x, scheme, 128), native.quantize(x, scheme, 128)
        assert_same(a, b)
        assert torch.equal(reference.dequantize(a), native.dequantize(b))


@pytest.mark.parametrize("scheme", SCHEMES)
def test_groups_with_nan_and_inf_give_the_same_bytes_at_every_level(scheme: str) -> None:
    # The reference propagates NaN into a group's scale; the native kernels skip NaN in the
    # group statistics (NaN elements encode as NaN's byte). Every native variant must agree on
    # that: the AVX-512 group kernels form codes differently (integer rounding and clamping for
    # finite zero points, a float path for a NaN zero point) from the portable loop.
    from ds.ops import _C

    g = torch.Generator().manual_seed(5)
    specials = [float("nan"), float("inf"), float("-inf")]
    groups = []
    for i in range(12):
        x = torch.randn(128, generator=g)
        x[(7 * i) % 128] = specials[i % 3]
        if i >= 6:
            x[(7 * i + 50) % 128] = specials[(i + 1) % 3]
        groups.append(x)
    x = torch.cat(groups)
    before = _C.simd_level()
    results = {}
    try:
        for level in _C.simd_levels_built().split(","):
            if _C.set_simd_level(level):
                results[level] = native.quantize(x, scheme, 128)
    finally:
        _C.set_simd_level(before)
    first = results.pop("scalar")
    assert results, "no SIMD variant runs on this CPU"
    for level, q in results.items():
        assert torch.equal(q.data.view(torch.uint8), first.data.view(torch.uint8)), level
        assert torch.equal(q.scales.view(torch.int32), first.scales.view(torch.int32)), level
        if first.zero_points is not None:
            assert q.zero_points is not None
            same = q.zero_points.view(torch.int32) == first.zero_points.view(torch.int32)
            assert bool(same.all()), level
        assert torch.equal(native.dequantize(q).isnan(), native.dequantize(first).isnan()), level
