"""The Triton kernel of the Lion step (imported only when triton is installed)."""

from __future__ import annotations

import triton
import triton.language as tl

from ds.ops.triton.store_kernels import load_step, store_step


@triton.jit
def lion_kernel(
    p_ptr,
    g_ptr,
    m_ptr,
    lp_ptr,
    beta1,
    beta2,
    one_minus_beta1,
    one_minus_beta2,
    lr,
    lr_wd,
    n,
    HAS_LP: tl.constexpr,
    BLOCK: tl.constexpr,
):
    offs, mask, p, g, m = load_step(p_ptr, g_ptr, m_ptr, n, BLOCK)
    c = beta1 * m + one_minus_beta1 * g
    direction = tl.where(c > 0, 1.0, tl.where(c < 0, -1.0, 0.0))
    p = p - (lr * direction + lr_wd * p)
    m = beta2 * m + one_minus_beta2 * g
    store_step(p_ptr, m_ptr, lp_ptr, offs, p, m, mask, HAS_LP)
