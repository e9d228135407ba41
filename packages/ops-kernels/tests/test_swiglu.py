"""Fused SwiGLU (Triton) against its pure-torch reference and autograd, forward and backward.
On CPU through the Triton interpreter; with a CUDA device the ``gpu`` test runs compiled."""

from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest

from ds.interfaces.errors import KernelError
from ds.ops.triton import swiglu_reference as ref

pytest.importorskip("triton", reason="triton is not installed (pip install ds-ops-kernels[triton])")
from ds.ops.triton import swiglu as fused

interpreted = pytest.mark.skipif(
    os.environ.get("TRITON_INTERPRET") != "1", reason="needs TRITON_INTERPRET=1 to run on CPU"
)

# float32 math inside both; low-precision outputs may differ by one rounding of the result
TOL = {
    torch.float64: (1e-12, 1e-12),
    torch.float32: (1e-6, 1e-6),
    torch.bfloat16: (2**-7, 1e-5),
    torch.float16: (2**-10, 1e-5),
}


def _inputs(shape: tuple[int, ...], dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(sum(shape))
    a = (torch.randn(shape, generator=g, dtype=torch.float64) * 4).to(dtype)
    b = torch.randn(shape, generator=g, dtype=torch.float64).to(dtype)
    return a, b


def test_reference_matches_torch_silu() -> None:
    a, b = _inputs((5, 7), torch.float64)
    torch.testing.assert_close(ref.swiglu(a, b), torch.nn.functional.silu(a) * b)
    a.requires_grad_(True)
    b.requires_grad_(True)
    g = torch.randn(5, 7, dtype=torch.float64)
    (torch.nn.functional.silu(a) * b).backward(g)
    da, db = ref.swiglu_backward(g, a.detach(), b.detach())
    torch.testing.assert_close(da, a.grad)
    torch.testing.assert_close(db, b.grad)


@interpreted
@pytest.mark.parametrize("dtype", list(TOL))
@pytest.mark.parametrize("shape", [(1,), (3, 1000), (2, 3, 345)])
def test_forward_matches_reference(dtype: torch.dtype, shape: tuple[int, ...]) -> None:
    a, b = _inputs(shape, dtype)
    out = fused.swiglu(a, b)
    assert out.dtype == dtype and out.shape == a.shape
    rtol, atol = TOL[dtype]
    torch.testing.assert_close(out, ref.swiglu(a, b), rtol=rtol, atol=atol)


@interpreted
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16])
def test_backward_matches_autograd_of_reference(dtype: torch.dtype) -> None:
    a, b = _inputs((4, 300), dtype)
    g = torch.randn(4, 300, dtype=torch.float64).to(dtype)
    a1, b1 = a.clone().requires_grad_(True), b.clone().requires_grad_(True)
    fused.swiglu(a1, b1).backward(g)
    da, db = ref.swiglu_backward(g, a, b)
    rtol, atol = TOL[dtype]
    assert a1.grad is not None and b1.grad is not None
    torch.testing.assert_close(a1.grad, da, rtol=rtol, atol=atol)
    torch.testing.assert_close(b1.grad, db, rtol=rtol, atol=atol)


@interpreted
def test_gradcheck_float64() -> None:
    a, b = _inputs((6,), torch.float64)
    assert torch.autograd.gradcheck(fused.swiglu, (a.requires_grad_(), b.requires_grad_()))


@interpreted
def test_non_contiguous_and_empty_inputs() -> None:
    x = torch.randn(6, 8)
    a, b = x.chunk(2, dim=-1)  # packed [..., 2H] layout: non-contiguous halves
    torch.testing.assert_close(fused.swiglu(a, b), ref.swiglu(a, b), rtol=1e-6, atol=1e-6)
    e = torch.empty(0, 4)
    assert fused.swiglu(e, e).shape == (0, 4)


def test_bad_inputs() -> None:
    with pytest.raises(KernelError, match="same shape"):
        fused.swiglu(torch.ones(3), torch.ones(4))
    with pytest.raises(KernelError, match="one dtype"):
        fused.swiglu(torch.ones(3), torch.ones(3, dtype=torch.float16))
    with pytest.raises(KernelError, match="floating-point"):
        fused.swiglu(torch.ones(3, dtype=torch.int32), torch.ones(3, dtype=torch.int32))


def test_cpu_without_interpreter_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with pytest.raises(KernelError, match="GPU tensors"):
        fused.swiglu(torch.ones(3), torch.ones(3))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_gpu_forward_backward(dtype: torch.dtype) -> None:
    a, b = _inputs((64, 4097), dtype)
    a, b = a.cuda().requires_grad_(), b.cuda().requires_grad_()
    out = fused.swiglu(a, b)
    rtol, atol = TOL[dtype]
    torch.testing.assert_close(out, ref.swiglu(a.detach(), b.detach()), rtol=rtol, atol=atol)
    g = torch.randn_like(out)
    out.backward(g)
    da, db = ref.swiglu_backward(g, a.detach(), b.detach())
    torch.testing.assert_close(a.grad, da, rtol=rtol, atol=atol)
    torch.testing.assert_close(b.grad, db, rtol=rtol, atol=atol)
