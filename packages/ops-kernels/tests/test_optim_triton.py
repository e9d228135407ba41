"""The Triton fused Adam step against its pure-torch reference and torch.optim.AdamW. On CPU it
runs through the Triton interpreter (TRITON_INTERPRET=1, set before triton is imported); with a
CUDA device the ``gpu`` tests run the compiled kernel."""

from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest

from ds.interfaces.errors import KernelError
from ds.ops import reference

pytest.importorskip("triton", reason="triton is not installed (pip install ds-ops-kernels[triton])")
from ds.ops.triton import adam as triton_adam

interpreted = pytest.mark.skipif(
    os.environ.get("TRITON_INTERPRET") != "1", reason="needs TRITON_INTERPRET=1 to run on CPU"
)
DTYPES = [torch.float32, torch.bfloat16, torch.float16]


def _run(device: str, dtype: torch.dtype, state_dtype: torch.dtype, n: int, steps: int) -> None:
    gen = torch.Generator().manual_seed(n)
    p = torch.randn(n, generator=gen).to(dtype).to(device)
    m = torch.zeros(n, dtype=state_dtype, device=device)
    v = torch.zeros(n, dtype=state_dtype, device=device)
    rp, rm, rv = p.clone(), m.clone(), v.clone()
    kw = {"lr": 1e-2, "weight_decay": 0.05}
    for step in range(1, steps + 1):
        g = torch.randn(n, generator=gen).to(dtype).to(device)
        triton_adam.adam_step(p, g, m, v, step=step, **kw)
        reference.adam_step(rp, g, rm, rv, step=step, **kw)
    # Same fp32 math, same rounding points; the two may differ by fp32 operation order only.
    tol = {torch.float32: 1e-6, torch.bfloat16: 2**-7, torch.float16: 2**-10}[dtype]
    torch.testing.assert_close(p.float(), rp.float(), rtol=tol, atol=tol)
    torch.testing.assert_close(m.float(), rm.float(), rtol=1e-5, atol=1e-6)


@interpreted
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", [1, 4096 + 3])
def test_triton_adam_matches_reference_interpreted(dtype: torch.dtype, n: int) -> None:
    _run("cpu", dtype, torch.float32, n, steps=3)


@interpreted
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_triton_adam_low_precision_state_interpreted(dtype: torch.dtype) -> None:
    _run("cpu", dtype, dtype, 1000, steps=3)


def test_reference_matches_torch_adamw() -> None:
    n = 4099
    gen = torch.Generator().manual_seed(0)
    p = torch.randn(n, generator=gen)
    m, v = torch.zeros(n), torch.zeros(n)
    ref = torch.nn.Parameter(p.clone())
    opt = torch.optim.AdamW([ref], lr=1e-2, weight_decay=0.05)
    for step in range(1, 21):
        g = torch.randn(n, generator=gen)
        reference.adam_step(p, g, m, v, step=step, lr=1e-2, weight_decay=0.05)
        ref.grad = g
        opt.step()
    torch.testing.assert_close(p, ref.detach(), rtol=1e-6, atol=1e-6)


@interpreted
def test_triton_adam_l2_mode_and_errors() -> None:
    n = 300
    p, g = torch.randn(n), torch.randn(n)
    m, v = torch.zeros(n), torch.zeros(n)
    rp, rm, rv = p.clone(), m.clone(), v.clone()
    kw = {"step": 1, "lr": 1e-2, "weight_decay": 0.1, "adamw_mode": False, "bias_correction": False}
    triton_adam.adam_step(p, g, m, v, **kw)
    reference.adam_step(rp, g, rm, rv, **kw)
    torch.testing.assert_close(p, rp, rtol=1e-6, atol=1e-6)
    with pytest.raises(KernelError, match="exp_avg has 3 elements"):
        triton_adam.adam_step(p, g, torch.zeros(3), v, step=1, lr=1e-3)
    with pytest.raises(KernelError, match="params requires grad"):
        triton_adam.adam_step(torch.nn.Parameter(p), g, m, v, step=1, lr=1e-3)
    with pytest.raises(KernelError, match="step must be >= 1"):
        triton_adam.adam_step(p, g, m, v, step=0, lr=1e-3)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("dtype", DTYPES)
def test_triton_adam_matches_reference_on_gpu(dtype: torch.dtype) -> None:
    _run("cuda", dtype, torch.float32, 10**6 + 17, steps=10)
