"""The native fp16- / fp32-weight linear (ds.ops.half_linear) against a float64 reference at odd
sizes and 1 to 16 rows (and a few more) on every SIMD variant, fp16 and fp32 activations, with
and without (fp16 / fp32) bias; the result does not depend on the thread count; when it applies;
refusals; the provider's method."""

from __future__ import annotations

import pytest
import torch

from ds.interfaces.errors import KernelError
from ds.interfaces.kernels import HalfLinearKernels
from ds.ops.half_linear import MAX_NATIVE_ROWS, MAX_NATIVE_ROWS_FP32, applies, linear
from ds.ops.provider import CpuKernelProvider

pytestmark = pytest.mark.usefixtures("one_torch_thread")

SIZES = [(1, 1), (7, 3), (577, 49), (16, 33), (7, 4099)]  # (in, out)
ROWS = [*range(1, 17), 19, 33]  # every block of 4 rows and remainder, and past the fast bound


def _check(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None) -> None:
    y = linear(x, w, b)
    assert y.dtype == x.dtype and y.shape == (*x.shape[:-1], w.shape[0])
    xd, wd = x.double(), w.double()
    ref = xd @ wd.T
    size = xd.abs() @ wd.abs().T
    if b is not None:
        ref = ref + b.double()
        size = size + b.double().abs()
    # fp32 sums: within 1e-6 of sum |x||w| (+|b|); an fp16 result adds its one rounding.
    bound = 1e-6 * size
    if x.dtype == torch.float16:
        bound = bound + ref.abs() * 2.0**-11 + 2.0**-24
    err = (y.double() - ref).abs()
    assert bool((err <= bound).all()), f"max error {float((err - bound).max())} over the bound"


@pytest.mark.parametrize("w_dtype", [torch.float16, torch.float32])
@pytest.mark.parametrize("x_dtype", [torch.float16, torch.float32])
def test_matches_float64(simd_level: str, x_dtype: torch.dtype, w_dtype: torch.dtype) -> None:
    g = torch.Generator().manual_seed(0)
    for k, n in SIZES:
        w = torch.randn(n, k, generator=g).to(w_dtype)
        for m in ROWS:
            x = torch.randn(m, k, generator=g).to(x_dtype)
            for b in (None, torch.randn(n, generator=g).half(), torch.randn(n, generator=g)):
                _check(x, w, b)


def test_shapes_and_layouts() -> None:
    g = torch.Generator().manual_seed(1)
    w = torch.randn(9, 13, generator=g).half()
    _check(torch.randn(2, 3, 13, generator=g).half(), w, None)  # leading dims kept
    _check(torch.randn(13, generator=g), w, None)  # one row, 1-D
    _check(torch.randn(13, 4, generator=g).half().t(), w, None)  # non-contiguous x
    wt = torch.randn(13, 9, generator=g).half().t()  # non-contiguous weight: copied, same result
    _check(torch.randn(2, 13, generator=g).half(), wt, torch.randn(9, generator=g))
    assert linear(torch.empty(0, 13), w).shape == (0, 9)
    many = torch.randn(40, 13, generator=g).half()  # past the fast path's row bound: still right
    _check(many, w, None)


@pytest.mark.parametrize("w_dtype", [torch.float16, torch.float32])
def test_threads_give_the_same_bits(w_dtype: torch.dtype) -> None:
    g = torch.Generator().manual_seed(2)
    w = torch.randn(4099, 67, generator=g).to(w_dtype)
    x = torch.randn(3, 67, generator=g).half()
    one = linear(x, w)
    torch.set_num_threads(2)  # one_torch_thread restores it
    assert torch.equal(linear(x, w), one)


def test_applies() -> None:
    w = torch.randn(5, 8).half()
    assert applies(torch.randn(1, 8).half(), w)
    assert applies(torch.randn(MAX_NATIVE_ROWS, 8), w)
    assert not applies(torch.randn(MAX_NATIVE_ROWS + 1, 8).half(), w)  # torch's GEMM is faster
    assert not applies(torch.randn(1, 8).bfloat16(), w)
    wf = w.float()
    assert applies(torch.randn(MAX_NATIVE_ROWS_FP32, 8), wf)
    assert not applies(torch.randn(MAX_NATIVE_ROWS_FP32 + 1, 8), wf)
    assert not applies(torch.randn(1, 8).half(), wf)  # F.linear refuses the mix; so does applies
    assert not applies(torch.randn(1, 8), w.bfloat16())
    assert not applies(torch.randn(1, 7), w)
    assert not applies(torch.randn(1, 8), torch.randn(8, 5).half().t())  # would copy per call
    assert not applies(torch.randn(1, 8, requires_grad=True), w)
    with torch.no_grad():
        assert applies(torch.randn(1, 8, requires_grad=True), w)


def test_refusals() -> None:
    w = torch.randn(5, 8).half()
    x = torch.randn(2, 8).half()
    with pytest.raises(KernelError, match="fp16 or fp32 CPU"):
        linear(x, w.bfloat16())
    with pytest.raises(KernelError, match="8 features"):
        linear(torch.randn(2, 7).half(), w)
    with pytest.raises(KernelError, match="fp16 or fp32"):
        linear(x.bfloat16(), w)
    with pytest.raises(KernelError, match="bias"):
        linear(x, w, torch.randn(4).half())
    with pytest.raises(KernelError, match="backward"):
        linear(torch.randn(2, 8, requires_grad=True), w)


def test_cpu_provider_has_it() -> None:
    p = CpuKernelProvider()
    assert isinstance(p, HalfLinearKernels)
    w = torch.randn(6, 10).half()
    x = torch.randn(2, 10).half()
    b = torch.randn(6).half()
    assert p.half_linear_applies(x, w)
    torch.testing.assert_close(p.half_linear(x, w, b), linear(x, w, b), atol=0, rtol=0)
    assert p.half_linear_applies(x.float(), w.float())
