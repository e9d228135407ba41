"""The Triton kernel of the Adagrad step (imported only when triton is installed)."""

from __future__ import annotations

import triton
import triton.language as tl

from ds.ops.triton.store_kernels import load_step, store_step


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
    offs, mask, p, g, s = load_step(p_ptr, g_ptr, s_ptr, n, BLOCK)
    g = g + weight_decay * p
    s = s + g * g
    p = p - lr * (g / (tl.sqrt(s) + eps))
    store_step(p_ptr, s_ptr, lp_ptr, offs, p, s, mask, HAS_LP)
