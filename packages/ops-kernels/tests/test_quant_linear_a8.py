"""``linear(x, q, activations="int8")``: x quantized to int8 per block of one weight group, exact
integer products per group, against a float64 reference of the same quantized math (dequantized
weights times dequantized activation codes), at every integer dot-product variant."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

from ds.interfaces.errors import ConfigError
from ds.ops import quant
from ds.ops.quant import activations as act
from ds.ops.quant import reference
from ds.ops.quant.linear import MAX_NATIVE_ROWS, linear, native_applies

SCHEMES = ["int8_sym", "int4_sym"]
# (rows of x, in, out, group size): batch 1 and 17 (passes of 8 rows of x on AVX-512, 4 on
# AVX2, and one left), 8 and 9; K a multiple of 32 but not of 64 (96, 160, 288); outputs in
# 16-row packed tiles: partial ones (5, 13, 37: AVX2 halves of 8 rows, the second empty or
# partial), whole ones (16, 24: the second half full or not); groups of 64 and 96 (one int32 sum
# over several 32-element blocks), and a group size the packed layout does not take (6: scalar
# on the stored layout).
SHAPES = [(1, 64, 5, 32), (17, 96, 13, 32), (17, 160, 37, 32), (16, 576, 9, 32),
          (1, 288, 7, 32), (3, 192, 7, 64), (5, 96, 11, 96), (2, 48, 3, 6), (9, 64, 16, 32),
          (8, 128, 24, 32)]  # fmt: skip


def _dot_isas() -> list[str]:
    from ds.ops import _C

    return [d for d in _C.int8_dot_isas_built().split(",") if d]


@pytest.fixture(params=_dot_isas())
def dot_isa(request: pytest.FixtureRequest) -> Iterator[str]:
    """Runs the test once per integer dot-product variant (skipped where the CPU cannot)."""
    from ds.ops import _C

    before = _C.int8_dot_isa()
    if not _C.set_int8_dot_isa(request.param):
        pytest.skip(f"this CPU cannot run the {request.param} variant")
    try:
        assert _C.int8_dot_isa() == request.param
        yield request.param
    finally:
        _C.set_int8_dot_isa(before)


def _want(x: torch.Tensor, q: quant.QuantizedTensor) -> tuple[torch.Tensor, torch.Tensor]:
    codes, scales = act.quantize(x, q.group_size)
    xd = act.dequantize(codes, scales, q.group_size).double()
    w = reference.dequantize(q).double()
    # fp32 sums of k products: bounded relative to the sum of their magnitudes.
    return xd @ w.T, (xd.abs() @ w.abs().T).clamp_min(1.0) * 1e-6


def _check(x: torch.Tensor, q: quant.QuantizedTensor) -> None:
    want, bound = _want(x, q)
    got = linear(x, q, activations="int8")
    assert got.shape == want.shape and got.dtype == torch.float32
    assert ((got.double() - want).abs() <= bound).all(), (got.double() - want).abs().max()


def test_every_variant_matches_float64(dot_isa: str) -> None:
    for scheme in SCHEMES:
        for m, k, n, gs in SHAPES:
            g = torch.Generator().manual_seed(m * 1000 + k)
            w, x = torch.randn(n, k, generator=g), torch.randn(m, k, generator=g) * 3
            x[0, :gs] = 0.0  # a block of zeros: scale 0, codes 0
            q = quant.quantize(w, scheme, gs)
            assert native_applies(x, q, "int8")
            _check(x, q)


def test_activation_codes_match_the_torch_form(dot_isa: str) -> None:
    from ds.ops import _C

    g = torch.Generator().manual_seed(2)
    x = torch.randn(6, 64, generator=g)
    # max|x| 127 makes 127 / max|x| exactly 1: products of .5 are ties, which go to the even
    # code on both sides.
    x[0, :32] = torch.arange(32) - 15.5
    x[0, 31] = 127.0
    x[1] = 0.0
    codes, scales = torch.empty(6, 64, dtype=torch.int8), torch.empty(12)
    _C.quant_activations(x, 32, codes, scales)
    want_codes, want_scales = act.quantize(x, 32)
    assert torch.equal(codes, want_codes) and torch.equal(scales, want_scales.reshape(-1))


def test_int8_activations_differ_from_float_by_their_rounding() -> None:
    g = torch.Generator().manual_seed(3)
    w, x = torch.randn(33, 128, generator=g), torch.randn(4, 128, generator=g)
    q = quant.quantize(w, "int8_sym", 32)
    a8, fp = linear(x, q, activations="int8"), linear(x, q)
    # Each activation is off by at most half a step, max|x of its block| / 254.
    step = act.quantize(x, 32)[1].repeat_interleave(32, -1) / 2
    bound = step.double() @ reference.dequantize(q).double().abs().T
    assert (a8 - fp).abs().max() > 0 and ((a8 - fp).abs().double() <= bound * 1.001 + 1e-5).all()


def test_many_rows_and_threads_run_the_kernel() -> None:
    from ds.ops import _C

    g = torch.Generator().manual_seed(4)
    w, x = torch.randn(301, 128, generator=g), torch.randn(2, MAX_NATIVE_ROWS, 128, generator=g)
    q = quant.quantize(w, "int4_sym", 32)
    assert native_applies(x, q, "int8") and not native_applies(x, q)
    before = _C.get_num_threads()
    _C.set_num_threads(2)
    try:
        b = torch.randn(301, generator=g)
        got = linear(x, q, b, activations="int8")
        want, bound = _want(x.reshape(-1, 128), q)
        assert ((got.reshape(-1, 301).double() - want - b.double()).abs() <= bound).all()
    finally:
        _C.set_num_threads(before)


def test_where_the_kernel_does_not_apply_torch_computes_the_same() -> None:
    g = torch.Generator().manual_seed(5)
    w, x = torch.randn(9, 96, generator=g), torch.randn(3, 96, generator=g)
    q = quant.quantize(w, "int8_sym", 32)
    want, bound = _want(x, q)
    ref = linear(x, q, impl="reference", activations="int8")
    assert ((ref.double() - want).abs() <= bound * 10).all()
    xg = x.clone().requires_grad_(True)  # needs a gradient: the torch form
    assert not native_applies(xg, q, "int8")
    assert ((linear(xg, q, activations="int8").double() - want).abs() <= bound * 10).all()
    y16 = linear(x.bfloat16(), q, activations="int8")
    assert y16.dtype == torch.bfloat16


@pytest.mark.parametrize("scheme", ["int8_asym", "int4_asym", "fp8_e4m3"])
def test_other_weight_schemes_are_refused(scheme: str) -> None:
    q = quant.quantize(torch.randn(4, 64), scheme, 32)
    with pytest.raises(ConfigError, match="symmetric integer weight scheme"):
        linear(torch.randn(1, 64), q, activations="int8")


def test_unknown_activation_modes_and_partial_groups_are_refused() -> None:
    q = quant.quantize(torch.randn(4, 64), "int8_sym", 32)
    with pytest.raises(ConfigError, match="'float' or 'int8'"):
        linear(torch.randn(1, 64), q, activations="int4")
    q70 = quant.quantize(torch.randn(4, 70), "int8_sym", 32)
    with pytest.raises(ConfigError, match="whole groups"):
        linear(torch.randn(1, 70), q70, activations="int8")
    from ds.ops import _C

    with pytest.raises(ValueError, match="unknown dot-product variant"):
        _C.set_int8_dot_isa("sse")


@pytest.mark.parametrize(("scheme", "code_bytes", "extra"), [("int8_sym", 96, 8), ("int4_sym", 48, 4)])
def test_the_packed_copy_is_made_once_and_follows_in_place_updates(
    scheme: str, code_bytes: int, extra: int
) -> None:
    from ds.ops.quant import linear as linear_mod

    g = torch.Generator().manual_seed(8)
    q = quant.quantize(torch.randn(21, 96, generator=g), scheme, 32)
    x = torch.randn(3, 96, generator=g)
    linear(x, q)  # float activations read the stored layout only
    w = linear_mod._prepared(q)
    assert w.a8_packed_bytes == 0
    _check(x, q)
    # 2 tiles of 16 rows: their codes, a scale per row and group and, for int8, a correction.
    assert linear_mod._prepared(q) is w and w.a8_packed_bytes == 32 * (code_bytes + 3 * extra)
    q.data.copy_(quant.quantize(torch.randn(21, 96, generator=g), scheme, 32).data)
    _check(x, q)
    q6 = quant.quantize(torch.randn(4, 48, generator=g), scheme, 6)
    _check(torch.randn(2, 48, generator=g), q6)
    assert linear_mod._prepared(q6).a8_packed_bytes == 0
