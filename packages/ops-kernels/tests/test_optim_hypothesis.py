"""Property tests: the fused kernels against float64 references over the hyperparameter space."""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from ds.ops import cpu_optim

N = 67  # four 16-lane blocks and a partial one
STEPS = 8

lrs = st.floats(1e-5, 1e-1)
betas1 = st.floats(0.0, 0.99)
betas2 = st.floats(0.5, 0.9999)
epss = st.floats(1e-10, 1e-3)
decays = st.floats(0.0, 0.5)


def _close(got: torch.Tensor, want: torch.Tensor) -> None:
    # fp32 kernel vs float64 reference (fp32 storage, rounded every step like the kernel's)
    scale = float(want.abs().max()) or 1.0
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6 * scale)


@settings(max_examples=40, deadline=None)
@given(
    lr=lrs,
    b1=betas1,
    b2=betas2,
    eps=epss,
    wd=decays,
    adamw=st.booleans(),
    bias_correction=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_adam_any_hyperparameters(
    lr: float,
    b1: float,
    b2: float,
    eps: float,
    wd: float,
    adamw: bool,
    bias_correction: bool,
    seed: int,
) -> None:
    gen = torch.Generator().manual_seed(seed)
    p = torch.randn(N, generator=gen)
    m, v = torch.zeros(N), torch.zeros(N)
    rp, rm, rv = p.clone(), m.clone(), v.clone()
    for step in range(1, STEPS + 1):
        g = torch.randn(N, generator=gen)
        cpu_optim.adam_step(
            p,
            g,
            m,
            v,
            step=step,
            lr=lr,
            beta1=b1,
            beta2=b2,
            eps=eps,
            weight_decay=wd,
            adamw_mode=adamw,
            bias_correction=bias_correction,
        )
        p64, g64, m64, v64 = rp.double(), g.double(), rm.double(), rv.double()
        if not adamw:
            g64 = g64 + wd * p64
        m64 = b1 * m64 + (1 - b1) * g64
        v64 = b2 * v64 + (1 - b2) * g64 * g64
        bc1 = 1 - b1**step if bias_correction else 1.0
        bc2 = 1 - b2**step if bias_correction else 1.0
        if adamw:
            p64 = p64 * (1 - lr * wd)
        p64 = p64 - lr / bc1 * m64 / (v64.sqrt() / bc2**0.5 + eps)
        rp.copy_(p64)
        rm.copy_(m64)
        rv.copy_(v64)
    _close(p, rp)
    _close(m, rm)
    _close(v, rv)


@settings(max_examples=30, deadline=None)
@given(lr=lrs, eps=epss, wd=decays, seed=st.integers(0, 2**16))
def test_adagrad_any_hyperparameters(lr: float, eps: float, wd: float, seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    p = torch.randn(N, generator=gen)
    s = torch.zeros(N)
    rp, rs = p.clone(), s.clone()
    for _ in range(STEPS):
        g = torch.randn(N, generator=gen)
        cpu_optim.adagrad_step(p, g, s, lr=lr, eps=eps, weight_decay=wd)
        g64 = g.double() + wd * rp.double()
        s64 = rs.double() + g64 * g64
        rp.copy_(rp.double() - lr * g64 / (s64.sqrt() + eps))
        rs.copy_(s64)
    _close(p, rp)
    _close(s, rs)


@settings(max_examples=30, deadline=None)
@given(lr=lrs, b1=betas1, b2=betas2, wd=decays, seed=st.integers(0, 2**16))
def test_lion_any_hyperparameters(lr: float, b1: float, b2: float, wd: float, seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    p = torch.randn(N, generator=gen)
    m = torch.randn(N, generator=gen)
    rp, rm = p.clone(), m.clone()
    for _ in range(STEPS):
        g = torch.randn(N, generator=gen)
        cpu_optim.lion_step(p, g, m, lr=lr, beta1=b1, beta2=b2, weight_decay=wd)
        m64, g64 = rm.double(), g.double()
        c = b1 * m64 + (1 - b1) * g64
        rp.copy_(rp.double() * (1 - lr * wd) - lr * torch.sign(c))
        rm.copy_(b2 * m64 + (1 - b2) * g64)
    _close(p, rp)
    _close(m, rm)
