"""The Triton kernel of the fused Adam/AdamW step (imported only when triton is installed)."""

from __future__ import annotations

import triton
import triton.language as tl

from ds.ops.triton.store_kernels import load_step, store_rounded, store_step


@triton.jit
def adam_kernel(
    p_ptr,
    g_ptr,
    m_ptr,
    v_ptr,
    lp_ptr,
    beta1,
    beta2,
    one_minus_beta1,
    one_minus_beta2,
    eps,
    weight_decay,
    decay,
    step_size,
    inv_sqrt_bc2,
    n,
    ADAMW: tl.constexpr,
    HAS_LP: tl.constexpr,
    BLOCK: tl.constexpr,
):
    offs, mask, p, g, m = load_step(p_ptr, g_ptr, m_ptr, n, BLOCK)
    v = tl.load(v_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    if not ADAMW:
        g = g + weight_decay * p
    m = beta1 * m + one_minus_beta1 * g
    v = beta2 * v + one_minus_beta2 * g * g
    denom = tl.sqrt(v) * inv_sqrt_bc2 + eps
    if ADAMW:
        p = p * decay
    p = p - step_size * (m / denom)
    store_rounded(v_ptr, offs, v, mask)
    store_step(p_ptr, m_ptr, lp_ptr, offs, p, m, mask, HAS_LP)
