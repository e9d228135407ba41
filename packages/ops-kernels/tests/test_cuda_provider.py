"""The ``cuda`` kernel provider: Triton Adam/AdamW, Lion and Adagrad against a float64 reference
and their pure-torch references (through TRITON_INTERPRET=1 on CPU, small and odd sizes), the
torch-fused backend against torch.optim, and the provider contract."""

from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest

from ds.interfaces import registry
from ds.interfaces.errors import KernelError
from ds.interfaces.kernels import AdagradHyper, AdamHyper, KernelProvider, LionHyper
from ds.ops import reference
from ds.ops.cuda_provider import CudaKernelProvider

pytest.importorskip("triton", reason="triton is not installed (pip install ds-ops-kernels[triton])")
from ds.ops.triton import adagrad as triton_adagrad
from ds.ops.triton import adam as triton_adam
from ds.ops.triton import lion as triton_lion

interpreted = pytest.mark.skipif(
    os.environ.get("TRITON_INTERPRET") != "1", reason="needs TRITON_INTERPRET=1 to run on CPU"
)
SIZES = [1, 7, 1023, 1025, 3 * 1024 + 5]
LOW = [torch.bfloat16, torch.float16]
# One rounding of the fp32 result to the storage dtype, against float64 math rounded once.
TOL = {torch.float32: 2e-6, torch.bfloat16: 2**-7, torch.float16: 2**-10}


def _data(n: int, dtype: torch.dtype, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(n, generator=gen).to(dtype), torch.randn(n, generator=gen).to(dtype)


# float64 definitions, written out independently of the kernels and the fp32 references.
def adam64(p, g, m, v, step, lr, b1, b2, eps, wd, adamw):  # type: ignore[no-untyped-def]
    if not adamw:
        g = g + wd * p
    m = b1 * m + (1 - b1) * g
    v = b2 * v + (1 - b2) * g * g
    if adamw:
        p = p * (1 - lr * wd)
    mhat, vhat = m / (1 - b1**step), v / (1 - b2**step)
    return p - lr * mhat / (vhat.sqrt() + eps), m, v


def lion64(p, g, m, lr, b1, b2, wd):  # type: ignore[no-untyped-def]
    p = p - lr * torch.sign(b1 * m + (1 - b1) * g) - lr * wd * p
    return p, b2 * m + (1 - b2) * g


def adagrad64(p, g, s, lr, eps, wd):  # type: ignore[no-untyped-def]
    g = g + wd * p
    s = s + g * g
    return p - lr * g / (s.sqrt() + eps), s


def _close(got: torch.Tensor, want: torch.Tensor, dtype: torch.dtype) -> None:
    tol = TOL[dtype]
    torch.testing.assert_close(got.double(), want.to(dtype).double(), rtol=tol, atol=tol)


@interpreted
@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("adamw", [True, False])
def test_triton_adam_fp32_matches_float64_over_steps(n: int, adamw: bool) -> None:
    p, _ = _data(n, torch.float32, n)
    m, v = torch.zeros(n), torch.zeros(n)
    low = torch.empty(n, dtype=torch.bfloat16)
    p64, m64, v64 = p.double(), m.double(), v.double()
    hyper = (1e-2, 0.9, 0.999, 1e-8, 0.05)
    for step in range(1, 4):
        g = torch.randn(n, generator=torch.Generator().manual_seed(step))
        triton_adam.adam_step(
            p, g, m, v, step=step, lr=1e-2, weight_decay=0.05, adamw_mode=adamw,
            low_precision_out=low,
        )  # fmt: skip
        p64, m64, v64 = adam64(p64, g.double(), m64, v64, step, *hyper, adamw)
    _close(p, p64, torch.float32)
    _close(m, m64, torch.float32)
    _close(v, v64, torch.float32)
    assert torch.equal(low, p.to(torch.bfloat16))


@interpreted
@pytest.mark.parametrize("dtype", LOW)
@pytest.mark.parametrize("n", [1, 1025])
def test_triton_low_precision_one_step_matches_float64(dtype: torch.dtype, n: int) -> None:
    p, g = _data(n, dtype, 3)
    m, v = torch.randn(n).abs().to(dtype) * 0.1, torch.rand(n).to(dtype) * 0.1
    want = adam64(
        p.double(), g.double(), m.double(), v.double(), 2, 1e-2, 0.9, 0.999, 1e-8, 0.0, True
    )
    triton_adam.adam_step(p, g, m, v, step=2, lr=1e-2)
    for got, w in zip((p, m, v), want, strict=True):
        _close(got, w, dtype)
    s = torch.rand(n).to(dtype)
    p2, g2 = _data(n, dtype, 4)
    want_p, want_s = adagrad64(p2.double(), g2.double(), s.double(), 1e-2, 1e-10, 0.01)
    triton_adagrad.adagrad_step(p2, g2, s, lr=1e-2, weight_decay=0.01)
    _close(p2, want_p, dtype)
    _close(s, want_s, dtype)


@interpreted
@pytest.mark.parametrize("n", SIZES)
def test_triton_lion_and_adagrad_fp32_match_float64(n: int) -> None:
    p, _ = _data(n, torch.float32, n + 1)
    m = torch.zeros(n)
    q, s = p.clone(), torch.zeros(n)
    p64, m64, q64, s64 = p.double(), m.double(), q.double(), s.double()
    for step in range(1, 4):
        g = torch.randn(n, generator=torch.Generator().manual_seed(10 + step))
        triton_lion.lion_step(p, g, m, lr=1e-3, weight_decay=0.1)
        p64, m64 = lion64(p64, g.double(), m64, 1e-3, 0.9, 0.99, 0.1)
        triton_adagrad.adagrad_step(q, g, s, lr=1e-2, weight_decay=0.01)
        q64, s64 = adagrad64(q64, g.double(), s64, 1e-2, 1e-10, 0.01)
    _close(p, p64, torch.float32)
    _close(m, m64, torch.float32)
    _close(q, q64, torch.float32)
    _close(s, s64, torch.float32)


@interpreted
@pytest.mark.parametrize("dtype", [torch.float32, *LOW])
def test_triton_kernels_match_their_torch_references(dtype: torch.dtype) -> None:
    n = 2 * 1024 + 3
    p, g = _data(n, dtype, 5)
    m, rp, rm = torch.zeros(n, dtype=dtype), p.clone(), torch.zeros(n, dtype=dtype)
    triton_lion.lion_step(p, g, m, lr=1e-3, weight_decay=0.1)
    reference.lion_step(rp, g, rm, lr=1e-3, weight_decay=0.1)
    assert torch.equal(p, rp) and torch.equal(m, rm)
    s, rs = torch.zeros(n), torch.zeros(n)
    triton_adagrad.adagrad_step(p, g, s, lr=1e-2)
    reference.adagrad_step(rp, g, rs, lr=1e-2)
    tol = TOL[dtype]
    torch.testing.assert_close(p.float(), rp.float(), rtol=tol, atol=tol)
    torch.testing.assert_close(s, rs, rtol=1e-6, atol=1e-7)


@interpreted
def test_triton_errors_name_the_tensor() -> None:
    p, g, m = torch.zeros(8), torch.zeros(8), torch.zeros(8)
    with pytest.raises(KernelError, match="exp_avg has 3 elements"):
        triton_lion.lion_step(p, g, torch.zeros(3), lr=1e-3)
    with pytest.raises(KernelError, match="state_sum is not contiguous"):
        triton_adagrad.adagrad_step(p, g, torch.zeros(16)[::2], lr=1e-3)
    with pytest.raises(KernelError, match="low_precision_out is a bfloat16 or float16 copy"):
        triton_lion.lion_step(p, g, m, lr=1e-3, low_precision_out=torch.zeros(8))


def _torch_run(opt_cls, hyper_kw, n: int, steps: int, **opt_kw):  # type: ignore[no-untyped-def]
    gen = torch.Generator().manual_seed(7)
    ref = torch.nn.Parameter(torch.randn(n, generator=gen))
    opt = opt_cls([ref], **opt_kw)
    grads = [torch.randn(n, generator=gen) for _ in range(steps)]
    for g in grads:
        ref.grad = g.clone()
        opt.step()
    return ref.detach(), grads


@pytest.mark.parametrize("adamw", [True, False])
def test_torch_backend_adam_is_torch_fused(adamw: bool) -> None:
    n, steps = 1025, 5
    cls = torch.optim.AdamW if adamw else torch.optim.Adam
    want, grads = _torch_run(cls, {}, n, steps, lr=1e-2, weight_decay=0.05, fused=True)
    prov = CudaKernelProvider(backend="torch")
    p = torch.randn(n, generator=torch.Generator().manual_seed(7))
    m, v = prov.new_state(p), prov.new_state(p)
    low = torch.empty(n, dtype=torch.float16)
    hyper = AdamHyper(lr=1e-2, weight_decay=0.05, adamw_mode=adamw)
    for step, g in enumerate(grads, start=1):
        prov.adam_step(step, hyper, p, g, m, v, low_precision_out=low)
    assert torch.equal(p, want)  # the same fused kernel, bit for bit
    assert torch.equal(low, p.half())


def test_torch_backend_adagrad_and_lion() -> None:
    n = 300
    want, grads = _torch_run(torch.optim.Adagrad, {}, n, 4, lr=1e-2, weight_decay=0.01)
    prov = CudaKernelProvider(backend="torch")
    p = torch.randn(n, generator=torch.Generator().manual_seed(7))
    s = prov.new_state(p)
    for step, g in enumerate(grads, start=1):
        prov.adagrad_step(step, AdagradHyper(lr=1e-2, weight_decay=0.01), p, g, s)
    torch.testing.assert_close(p, want, rtol=1e-6, atol=1e-6)
    q, m = torch.zeros(n), torch.zeros(n)
    p64, m64 = q.double(), m.double()
    for step, g in enumerate(grads, start=1):
        prov.lion_step(step, LionHyper(lr=1e-3, weight_decay=0.1), q, g, m)
        p64, m64 = lion64(p64, g.double(), m64, 1e-3, 0.9, 0.99, 0.1)
    _close(q, p64, torch.float32)


@interpreted
def test_triton_backend_through_the_provider_interface() -> None:
    n = 1000
    tri, ref = CudaKernelProvider(backend="triton"), CudaKernelProvider(backend="torch")
    assert tri.info()["optimizer_backend"] == "triton"
    bufs = [[t.clone() for t in _data(n, torch.float32, 9)] + [torch.zeros(n), torch.zeros(n)]]
    bufs.append([t.clone() for t in bufs[0]])
    for step in (1, 2):
        tri.adam_step(step, AdamHyper(lr=1e-2), *bufs[0])
        ref.adam_step(step, AdamHyper(lr=1e-2), *bufs[1])
    torch.testing.assert_close(bufs[0][0], bufs[1][0], rtol=2e-6, atol=2e-6)


def test_fake_tensors_take_the_reference() -> None:
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        p, g, m, v = (torch.zeros(64) for _ in range(4))
        CudaKernelProvider(backend="auto").adam_step(1, AdamHyper(lr=1e-3), p, g, m, v)
        CudaKernelProvider(backend="auto").lion_step(1, LionHyper(lr=1e-3), p, g, m)
    assert p.shape == (64,)


def test_registered_as_cuda_and_implements_the_contract() -> None:
    prov = registry.get(registry.KERNELS, "cuda")()
    assert isinstance(prov, KernelProvider)
    assert prov.name() == "cuda" and tuple(prov.devices()) == ("cuda",)
    with pytest.raises(Exception, match="backend='fast'"):
        CudaKernelProvider(backend="fast")  # type: ignore[arg-type]
