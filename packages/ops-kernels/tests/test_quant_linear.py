"""The quantized linear layer (ds.ops.quant.linear) against a float64 reference: the native kernel
that reads int8/int4 codes directly, at every SIMD variant, and the dequantize-then-matmul path
it leaves to (many rows, fp8, rows not made of whole groups)."""

from __future__ import annotations

import pytest
import torch

from ds.ops import quant
from ds.ops.quant import reference
from ds.ops.quant.linear import MAX_NATIVE_ROWS, linear, native_applies

INT_SCHEMES = ["int8_sym", "int8_asym", "int4_sym", "int4_asym"]
# (rows of x, in, out, group size): odd sizes, groups shorter and longer than one SIMD register,
# a row count past each block of 4, the largest the native kernel takes; output counts past a
# whole number of the kernel's blocks of output rows (4, 4, 4 or 3 rows at a time for 1 to 4 rows
# of x on AVX-512, 4, 3, 2 or 1 on AVX2) at every row count, so both the blocks and the rows left
# after them run.
SHAPES = [(1, 64, 5, 32), (3, 96, 7, 32), (5, 576, 13, 64), (MAX_NATIVE_ROWS, 40, 3, 8),
          (2, 6, 3, 2), (7, 250, 9, 50), (1, 96, 29, 32), (2, 64, 17, 32), (4, 64, 11, 16)]  # fmt: skip


def _check(x: torch.Tensor, q: quant.QuantizedTensor, bias: torch.Tensor | None) -> None:
    w = reference.dequantize(q).double()
    want = x.double() @ w.T + (bias.double() if bias is not None else 0.0)
    got = linear(x, q, bias)
    assert got.shape == want.shape and got.dtype == x.dtype
    # fp32 sums of k products: bounded relative to the sum of their magnitudes.
    bound = (x.double().abs() @ w.abs().T).clamp_min(1.0) * 1e-6
    assert ((got.double() - want).abs() <= bound).all(), (got.double() - want).abs().max()


@pytest.mark.parametrize("scheme", INT_SCHEMES)
@pytest.mark.parametrize("shape", SHAPES)
def test_native_kernel_matches_float64(scheme: str, shape: tuple[int, int, int, int]) -> None:
    m, k, n, gs = shape
    g = torch.Generator().manual_seed(m * 1000 + k)
    w, x, b = (torch.randn(*s, generator=g) for s in ((n, k), (m, k), (n,)))
    q = quant.quantize(w, scheme, gs)
    assert native_applies(x, q)
    _check(x, q, b)
    _check(x, q, None)


def test_every_simd_variant_matches_float64(simd_level: str) -> None:
    for scheme in INT_SCHEMES:
        for m, k, n, gs in SHAPES:
            g = torch.Generator().manual_seed(k)
            w, x = torch.randn(n, k, generator=g), torch.randn(m, k, generator=g)
            _check(x, quant.quantize(w, scheme, gs), None)


def test_batch_dimensions_and_many_threads() -> None:
    from ds.ops import _C

    g = torch.Generator().manual_seed(3)
    w, x = torch.randn(301, 128, generator=g), torch.randn(2, 3, 128, generator=g)
    q = quant.quantize(w, "int8_sym", 32)
    assert native_applies(x, q)
    before = _C.get_num_threads()
    _C.set_num_threads(2)  # output rows split over two threads
    try:
        _check(x, q, torch.randn(301, generator=g))
    finally:
        _C.set_num_threads(before)


@pytest.mark.parametrize(
    ("scheme", "m", "k", "gs", "why"),
    [
        ("int8_sym", MAX_NATIVE_ROWS + 1, 64, 32, "many rows: a GEMM on the dequantized weight"),
        ("fp8_e4m3", 1, 64, 32, "fp8"),
        ("int8_sym", 1, 70, 32, "rows not made of whole groups"),
        ("int4_sym", 1, 63, 7, "4-bit codes with an odd group size"),
    ],
)
def test_other_cases_dequantize_and_match(scheme: str, m: int, k: int, gs: int, why: str) -> None:
    g = torch.Generator().manual_seed(k)
    w, x = torch.randn(9, k, generator=g), torch.randn(m, k, generator=g)
    q = quant.quantize(w, scheme, gs)
    assert not native_applies(x, q), why
    _check(x, q, None)
    # Another dtype than float32 takes the same path.
    assert not native_applies(x.bfloat16(), quant.quantize(w, "int8_sym", 32))


def test_the_kernel_refuses_mismatched_buffers() -> None:
    from ds.ops import _C

    q = quant.quantize(torch.randn(4, 64), "int8_sym", 32)
    data, scales = q.data.view(torch.uint8), q.scales
    y = torch.empty(1, 4)
    with pytest.raises(ValueError, match="multiple of group_size"):
        _C.linear_int(torch.randn(64), data, scales, scales[:0], 60, 4, 32, 8, False, -127, 127, y)
    with pytest.raises(ValueError, match="data has the wrong size"):
        _C.linear_int(torch.randn(64), data, scales, scales[:0], 64, 5, 32, 8, False, -127, 127, y)
    with pytest.raises(ValueError, match="y has the wrong size"):
        _C.linear_int(torch.randn(128), data, scales, scales[:0], 64, 4, 32, 8, False, -127, 127, y)


def test_activations_that_need_a_gradient_get_one() -> None:
    g = torch.Generator().manual_seed(1)
    w, x = torch.randn(5, 64, generator=g), torch.randn(1, 64, generator=g, requires_grad=True)
    q = quant.quantize(w, "int8_sym", 32)
    assert not native_applies(x, q)
    linear(x, q).sum().backward()
    assert x.grad is not None
    torch.testing.assert_close(x.grad, reference.dequantize(q).sum(0, keepdim=True))
    with torch.no_grad():
        assert native_applies(x, q)


def test_the_prepared_weight_runs_the_same_kernel() -> None:
    """QLinearWeight (the weight checked once, x and y passed by address) gives the checked
    form's result bit for bit, refuses mismatched weights when built, and takes 0 rows."""
    from ds.ops import _C
    from ds.ops.quant._schemes import get_scheme

    g = torch.Generator().manual_seed(5)
    for scheme in INT_SCHEMES:
        s = get_scheme(scheme)
        q = quant.quantize(torch.randn(21, 96, generator=g), scheme, 32)
        data = q.data.view(torch.uint8)
        zps = q.zero_points if q.zero_points is not None else q.scales[:0]
        x, want, got = torch.randn(3, 96, generator=g), torch.empty(3, 21), torch.empty(3, 21)
        _C.linear_int(x, data, q.scales, zps, 96, 21, 32, s.bits, s.asym, s.qmin, s.qmax, want)
        w = _C.QLinearWeight(data, q.scales, zps, 96, 21, 32, s.bits, s.asym, s.qmin, s.qmax)
        w.run(x.data_ptr(), 3, got.data_ptr())
        assert torch.equal(got, want)
        w.run(0, 0, 0)  # no rows: nothing read or written
    with pytest.raises(ValueError, match="data has the wrong size"):
        _C.QLinearWeight(data, q.scales, zps, 96, 22, 32, 4, True, 0, 15)
    with pytest.raises(ValueError, match="m must not be negative"):
        w.run(x.data_ptr(), -1, got.data_ptr())


def test_the_prepared_form_lives_as_long_as_its_weight() -> None:
    import gc

    from ds.ops.quant import linear as linear_mod

    g = torch.Generator().manual_seed(6)
    q = quant.quantize(torch.randn(7, 64, generator=g), "int8_sym", 32)
    x = torch.randn(1, 64, generator=g)
    _check(x, q, None)
    key = id(q)
    assert linear_mod._PREPARED[key] is not None
    # An in-place update of the codes is seen: the prepared form reads the weight's own storage.
    q.data.neg_()
    _check(x, q, None)
    del q
    gc.collect()
    assert key not in linear_mod._PREPARED


def test_a_weight_with_non_contiguous_arrays_is_dequantized() -> None:
    import dataclasses

    g = torch.Generator().manual_seed(7)
    q = quant.quantize(torch.randn(5, 64, generator=g), "int4_sym", 32)
    strided = torch.stack([q.data, q.data], 1)[:, 0]  # the same codes, every other byte
    q2 = dataclasses.replace(q, data=strided)
    x = torch.randn(2, 64, generator=g)
    assert not strided.is_contiguous() and not native_applies(x, q2)
    _check(x, q2, None)
