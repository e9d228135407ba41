"""The Triton kernel of the Adagrad step (imported only when triton is installed)."""

from __future__ import annotations

import triton
import triton.language as tl

from ds.ops.triton.store_kernels import block_offsets, store_rounded


@triton.jit
def adagrad_kernel(
    p_ptr,
    g_ptr,
    s_ptr,
    lp_ptr,
    lr,
    eps,
    weight_decay,
    n,
    HAS_LP: tl.constexpr,
    BLOCK: tl.constexpr,
):
    offs, mask = block_offsets(n, BLOCK)
    p = tl.load(p_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    g = tl.load(g_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    s = tl.load(s_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    g = g + weight_decay * p
    s = s + g * g
    p = p - lr * (g / (tl.sqrt(s) + eps))
    store_rounded(p_ptr, offs, p, mask)
    store_rounded(s_ptr, offs, s, mask)
    if HAS_LP:
        store_rounded(lp_ptr, offs, p, mask)
