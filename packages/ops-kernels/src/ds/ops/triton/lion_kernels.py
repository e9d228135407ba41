"""The Triton kernel of the Lion step (imported only when triton is installed)."""

from __future__ import annotations

import triton
import triton.language as tl

from ds.ops.triton.store_kernels import block_offsets, store_rounded


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
    offs, mask = block_offsets(n, BLOCK)
    p = tl.load(p_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    g = tl.load(g_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    m = tl.load(m_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    c = beta1 * m + one_minus_beta1 * g
    direction = tl.where(c > 0, 1.0, tl.where(c < 0, -1.0, 0.0))
    p = p - (lr * direction + lr_wd * p)
    m = beta2 * m + one_minus_beta2 * g
    store_rounded(p_ptr, offs, p, mask)
    store_rounded(m_ptr, offs, m, mask)
    if HAS_LP:
        store_rounded(lp_ptr, offs, p, mask)
